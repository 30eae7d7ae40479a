package resource_test

import (
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// A sub-allocator in a streaming pipeline: each batch gets a scratch
// buffer on its stage's stream and gives it back at once, in stream
// order, so the pipeline reaches a steady state with no driver allocation
// at all. Two streams alternate so uploads overlap. examples/streaming-
// pipeline is the whole program, with its data checked.
func ExampleNewSubAllocator_pipeline() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := resource.NewSubAllocator(pool, &resource.SubAllocatorOptions{InitialSize: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	stats := resource.NewStatistics(mr) // how much the pipeline holds at its worst
	var streams [2]*cuda.Stream
	for i := range streams {
		if streams[i], err = dev.NewStream(); err != nil {
			log.Fatal(err)
		}
	}
	batch := make([]float32, 1<<20)
	for i := range 16 {
		s := streams[i%2]
		buf, err := stats.Allocate(uint64(len(batch))*4, s)
		if err != nil {
			log.Fatal(err)
		}
		if err := buffer.CopyFromHost(buf, batch, s); err != nil {
			log.Fatal(err)
		}
		// ... launch this stage's kernels on s ...
		if err := buf.Close(); err != nil { // reusable on s at once
			log.Fatal(err)
		}
	}
	for _, s := range streams {
		if err := s.Sync(); err != nil {
			log.Fatal(err)
		}
	}
	if err := mr.Close(); err != nil { // gives the blocks back to the pool
		log.Fatal(err)
	}
	for _, s := range streams {
		s.Close()
	}
	fmt.Println("peak", stats.Stats().PeakBytes, "bytes in", stats.Stats().TotalCount, "allocations")
}

// scratchArena is a test double: a MemoryResource that hands out address ranges
// of its own and never touches memory, so code that allocates can be
// tested without a GPU. Any type with these methods can back a Buffer.
type scratchArena struct {
	mu   sync.Mutex
	next cuda.DevicePtr
}

func (a *scratchArena) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next == 0 {
		a.next = 1 << 40
	}
	p := a.next
	a.next += cuda.DevicePtr((size + 255) &^ 255)
	return p, s, nil
}
func (a *scratchArena) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (a *scratchArena) DeviceAccessible() bool                                { return true }
func (a *scratchArena) HostAccessible() bool                                  { return false }
func (a *scratchArena) DeviceID() int                                         { return 0 }

// Adaptors over a test double run without a GPU: a byte cap and counters
// around the scratchArena above.
func ExampleNewLimiting_withoutGPU() {
	stats := resource.NewStatistics(&scratchArena{})
	mr := resource.NewLimiting(stats, 3<<20) // at most 3 MiB live
	var live []*buffer.Buffer
	for range 4 {
		buf, err := mr.Allocate(1<<20, nil)
		if errors.Is(err, cuda.ErrorOutOfMemory) {
			fmt.Println("refused: over the limit")
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		live = append(live, buf)
	}
	for _, b := range live {
		b.Close()
	}
	st := stats.Stats()
	fmt.Printf("peak %d MiB, %d allocations, %d live\n", st.PeakBytes>>20, st.TotalCount, st.CurrentCount)
	// Output:
	// refused: over the limit
	// peak 3 MiB, 3 allocations, 0 live
}
