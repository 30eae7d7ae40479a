package resource_test

import (
	"fmt"
	"log"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// A stack for allocation-heavy code: a sub-allocator over the device's
// pool (same-stream pairs make no driver call), and statistics over it.
// Every layer is a buffer.MemoryResource; Close of a Buffer goes down
// through all of them.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err) // without a driver: says which paths were tried
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	pool, err := resource.CurrentDevicePool(dev) // the device's own pool
	if err != nil {
		log.Fatal(err)
	}
	sub, err := resource.NewSubAllocator(pool, &resource.SubAllocatorOptions{GrowSize: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close() // gives its blocks back once their buffers are closed
	stats := resource.NewStatistics(sub)

	for range 1000 {
		b, err := stats.Allocate(256<<10, s) // ordered on s
		if err != nil {
			log.Fatal(err)
		}
		if err := b.Fill32(0, s); err != nil {
			log.Fatal(err)
		}
		if err := b.Close(); err != nil { // freed on s, reused at once on s
			log.Fatal(err)
		}
	}
	st := stats.Stats()
	fmt.Println(st.TotalCount, st.CurrentBytes, st.PeakBytes) // 1000 0 262144
}
