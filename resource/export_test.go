package resource

import (
	"sync"
	"testing"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// ParallelPairs is parallelPairs, for the benchmarks of package
// resource_test (the GPU ones).
var ParallelPairs = parallelPairs

// parallelGoroutines are the goroutine counts of the parallel benchmarks.
var parallelGoroutines = []int{1, 4, 16, 64}

// ParallelGoroutines is parallelGoroutines, for package resource_test.
var ParallelGoroutines = parallelGoroutines

// parallelPairs runs b.N allocate+free pairs split among g goroutines,
// goroutine i running pair(stream(i)), all started at once, and reports
// the aggregate rate as pairs/s (ns/op is the wall time per pair of all
// goroutines together, so it falls as they scale). Each goroutine runs
// one pair before the clock starts, so that first-use costs (growth, a
// stream's first cache) are not timed. It uses explicit goroutines rather
// than b.RunParallel so that the count, not GOMAXPROCS, sets the
// parallelism, and every goroutine keeps its own stream.
func parallelPairs(b *testing.B, g int, stream func(i int) *cuda.Stream, pair func(s *cuda.Stream) error) {
	b.ReportAllocs()
	streams := make([]*cuda.Stream, g)
	for i := range g {
		streams[i] = stream(i)
		if err := pair(streams[i]); err != nil {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range g {
		n := b.N / g
		if i < b.N%g {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s := streams[i]
			for range n {
				if err := pair(s); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	b.ResetTimer()
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
}

// NewSubAllocatorNoDriver is NewSubAllocator with the fake orderer of the
// CPU tests (saOrder), so that package resource_test can use a
// SubAllocator over a fake upstream without a driver.
func NewSubAllocatorNoDriver(up buffer.MemoryResource, opts *SubAllocatorOptions) (*SubAllocator, error) {
	a, err := NewSubAllocator(up, opts)
	if err == nil {
		a.order = &saOrder{}
	}
	return a, err
}
