package resource_test

import (
	"fmt"
	"log"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// A sub-allocator over the device's pool, for code that allocates and
// frees many small buffers: after the first block, a pair costs no driver
// call. Blocks come from the pool 64 MiB at a time, up to 4 GiB.
func ExampleNewSubAllocator() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close() // after the sub-allocator's Close below

	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := resource.NewSubAllocator(pool, &resource.SubAllocatorOptions{
		InitialSize: 64 << 20,
		MaxSize:     4 << 30,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close() // gives the blocks back to the pool

	for i := range 1000 {
		buf, err := mr.Allocate(uint64(i%64+1)*1024, s) // usable on s at once
		if err != nil {
			log.Fatal(err)
		}
		if err := s.MemsetD8Async(buf.Ptr(), byte(i), buf.Size()); err != nil {
			log.Fatal(err)
		}
		if err := buf.Close(); err != nil { // reusable on s at once, on other streams once ordered after s
			log.Fatal(err)
		}
	}
	st := mr.Stats()
	fmt.Printf("%d blocks, %d bytes reserved, %d live allocations\n", st.Blocks, st.Reserved, st.Allocations)
}
