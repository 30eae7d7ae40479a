package resource_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// A managed pool that prefers the device: data copied in from the host,
// moved to the device before kernels use it, and back for the CPU to read
// in place.
func ExampleNewManagedPool() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.NewManagedPool(dev, &resource.ManagedPoolOptions{PreferredLocation: cuda.DeviceLocation(dev)})
	if errors.Is(err, cuda.ErrNotSupported) {
		log.Fatal(err) // an older driver, or no concurrent managed access: resource.NewManaged serves
	}
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	b, err := pool.Allocate(1<<20, s)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	if err := buffer.CopyFromHost(b, make([]float32, 1<<18), s); err != nil {
		log.Fatal(err)
	}
	if err := resource.Prefetch(b, cuda.DeviceLocation(dev), s); err != nil {
		log.Fatal(err)
	}
	// ... kernels on s ...
	if err := resource.Prefetch(b, cuda.HostLocation(), s); err != nil {
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
	host, err := b.Bytes()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(host))
}

// Many buffers moved in one driver call, each to its own place, and the
// locations read back.
func ExamplePrefetchBatch() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := resource.NewManaged(dev, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream() // batches refuse the legacy default stream
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	var bufs []*buffer.Buffer
	for range 2 {
		b, err := mr.Allocate(2<<20, s)
		if err != nil {
			log.Fatal(err)
		}
		defer b.Close()
		bufs = append(bufs, b)
	}
	locs := []cuda.MemLocation{cuda.HostLocation(), cuda.DeviceLocation(dev)}
	if err := resource.PrefetchBatch(bufs, locs, s); err != nil {
		log.Fatal(err) // cuda.ErrNotSupported before CUDA 13.0
	}
	for _, b := range bufs {
		info, err := resource.QueryManaged(b)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(info.LastPrefetchLocation) // host, then GPU 0
	}
}
