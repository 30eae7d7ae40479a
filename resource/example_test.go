package resource_test

import (
	"fmt"
	"github.com/cudamem/cudamem/buffer"
	"log"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// The device's current pool, borrowed: stream-ordered allocation that
// keeps freed memory cached for the next request.
func ExampleCurrentDevicePool() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	buf, err := mr.Allocate(1<<20, s) // usable on s at once
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close() // freed on s, in stream order
	if err := s.MemsetD32Async(buf.Ptr(), 0, buf.Size()/4); err != nil {
		log.Fatal(err)
	}
}

// An owned pool with options: a 1 GiB cap, 256 MiB reserved up front, and
// peer access for the second GPU.
func ExampleNewDevicePool_options() {
	devs, err := cuda.Devices()
	if err != nil {
		log.Fatal(err)
	}
	mr, err := resource.NewDevicePool(devs[0], &resource.DevicePoolOptions{
		MaxSize:        1 << 30,
		InitialReserve: 256 << 20,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close() // revokes peer access, destroys the pool

	if len(devs) > 1 {
		if err := mr.SetPeerAccess(devs[1]); err != nil {
			log.Fatal(err)
		}
	}
	a, err := mr.Attributes()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("reserved %d bytes, %d in use\n", a.ReservedMemCurrent, a.UsedMemCurrent)
}

// Pinned host memory from a pool: the CPU reads what a device wrote.
func ExampleNewPinnedPool() {
	mr, err := resource.NewPinnedPool(nil)
	if err != nil {
		log.Fatal(err) // errors.Is(err, cuda.ErrNotSupported): try NewLegacyPinned
	}
	defer mr.Close()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s := dev.DefaultStream()
	buf, err := mr.Allocate(4096, s)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()
	if err := s.MemsetD8Async(buf.Ptr(), 7, buf.Size()); err != nil {
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
	u := uintptr(buf.Ptr()) // the unified address is the host address
	host := unsafe.Slice(*(**byte)(unsafe.Pointer(&u)), buf.Size())
	fmt.Println(host[0])
}

// Managed memory, prefetched to the device before kernels use it and back
// to the host before the CPU reads it.
func ExampleNewManaged() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := resource.NewManaged(dev, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	buf, err := mr.Allocate(64<<20, s)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()

	gpu := cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(dev.Ordinal())}
	if err := resource.Advise(buf, cuda.MemAdviseSetPreferredLocation, gpu); err != nil {
		log.Fatal(err)
	}
	if err := resource.Prefetch(buf, gpu, s); err != nil {
		log.Fatal(err)
	}
	// ... launch kernels on s ...
	if err := resource.Prefetch(buf, cuda.MemLocation{Type: cuda.MemLocationTypeHost}, s); err != nil {
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
}

// The per-device default resource: a DevicePool where the device has
// memory pools, a SyncDevice otherwise, unless SetDefault picked another.
func ExampleDefault() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := resource.Default(dev)
	if err != nil {
		log.Fatal(err)
	}
	buf, err := buffer.Allocate(mr, 1024, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()
	fmt.Printf("%v\n", mr)
}
