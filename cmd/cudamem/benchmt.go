package main

import (
	"errors"
	"fmt"
	"runtime/metrics"
	"slices"
	"sync"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// The concurrency measurements: suballoc/mt/G/own and .../shared are G
// goroutines each making 256-byte resource.SubAllocator pairs (Allocate +
// Buffer.Close) over resource.CurrentDevicePool(dev), each goroutine on a
// stream of its own (own) or all on one stream (shared). The figure is
// the aggregate: wall time from the start signal until the last goroutine
// is done, per pair. The baseline is the driver pool pair
// (cuMemAllocFromPoolAsync + cuMemFreeAsync on the device's default pool)
// from as many pthreads, measured by the C baseline (testdata/cgobench).
const (
	mtPrefix = "suballoc/mt/"
	mtSize   = 256
)

// mtCounts are the goroutine (thread) counts and the pairs each makes per
// run; fewer per goroutine at high counts keeps a run short. The C
// baseline uses the same table for its driver pool pairs. Ours run goMul
// times as many: a sub-allocator pair takes a tenth of a driver pair's
// time or less, and runs as short as the C table's (a few milliseconds at 16 and
// 64 goroutines) measured goroutine start-up and collector phase more
// than the pairs (1.6x to 3.5x between the repetitions of one lease).
var mtCounts = []struct{ g, iters int }{{1, 20_000}, {4, 20_000}, {16, 8_000}, {64, 2_000}}

const goMul = 8

func mtMeasurements(e *benchEnv) []measurement {
	var streams []*cuda.Stream
	var pool *resource.DevicePool
	var setupErr error
	ready := false
	common := func() error {
		if ready {
			return setupErr
		}
		ready = true
		pool, setupErr = resource.CurrentDevicePool(e.dev)
		if setupErr != nil {
			return setupErr
		}
		for range mtCounts[len(mtCounts)-1].g {
			s, err := e.dev.NewStream()
			if err != nil {
				setupErr = err
				return err
			}
			e.cleanup = append(e.cleanup, s.Close)
			streams = append(streams, s)
		}
		return nil
	}
	var ms []measurement
	for _, mode := range []string{"own", "shared"} {
		for _, c := range mtCounts {
			g := c.g
			var sub *resource.SubAllocator
			var last map[string]float64
			ms = append(ms, measurement{
				name:     fmt.Sprintf("%s%d/%s", mtPrefix, g, mode),
				baseline: fmt.Sprintf("poolpair/mt/c/%d/%s", g, mode),
				iters:    c.iters * goMul, perIter: g, rate: true,
				setup: func() error {
					if err := common(); err != nil {
						return err
					}
					var err error
					if sub, err = resource.NewSubAllocator(pool, nil); err != nil {
						return err
					}
					e.cleanup = append(e.cleanup, sub.Close)
					return nil
				},
				run: func(n int) (time.Duration, error) {
					var d time.Duration
					var err error
					last, d, err = mtProbe(func() (time.Duration, []time.Duration, error) {
						return concurrentPairs(sub, streams, g, mode == "shared", n)
					})
					return d, err
				},
				extra: func() map[string]float64 { return last },
			})
		}
	}
	return ms
}

// mtProbe runs f (concurrentPairs) and says where its wall time went:
// the collections it saw and their share of the CPU, and how the
// goroutines' finishing times spread (a run whose last goroutine ends
// long after the median one measured the scheduler, not the pairs).
func mtProbe(f func() (time.Duration, []time.Duration, error)) (map[string]float64, time.Duration, error) {
	samples := []metrics.Sample{
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
	}
	metrics.Read(samples)
	before := []float64{float64(samples[0].Value.Uint64()), samples[1].Value.Float64(), samples[2].Value.Float64()}
	d, ends, err := f()
	if err != nil {
		return nil, d, err
	}
	metrics.Read(samples)
	x := map[string]float64{"gc_cycles": float64(samples[0].Value.Uint64()) - before[0]}
	// The CPU classes are estimates the runtime updates at collections;
	// a run with none has no share to give.
	if cpu := samples[2].Value.Float64() - before[2]; cpu > 0 && x["gc_cycles"] > 0 {
		x["gc_cpu_share"] = (samples[1].Value.Float64() - before[1]) / cpu
	}
	if len(ends) > 0 && d > 0 {
		sorted := slices.Clone(ends)
		slices.Sort(sorted)
		x["first_end"] = float64(sorted[0]) / float64(d)
		x["median_end"] = float64(sorted[len(sorted)/2]) / float64(d)
	}
	return x, d, nil
}

// concurrentPairs runs g goroutines of n pairs each and returns the wall
// time from their common start until the last finished, and when each
// finished (since the start).
func concurrentPairs(sub *resource.SubAllocator, streams []*cuda.Stream, g int, shared bool, n int) (time.Duration, []time.Duration, error) {
	if g > len(streams) {
		return 0, nil, fmt.Errorf("%d goroutines, %d streams", g, len(streams))
	}
	start := make(chan struct{})
	errs := make([]error, g)
	ends := make([]time.Duration, g)
	var t0 time.Time
	var wg sync.WaitGroup
	for i := range g {
		s := streams[i]
		if shared {
			s = streams[0]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			defer func() { ends[i] = time.Since(t0) }()
			for range n {
				b, err := sub.Allocate(mtSize, s)
				if err == nil {
					err = b.Close()
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	t0 = time.Now()
	close(start)
	wg.Wait()
	d := time.Since(t0)
	return d, ends, errors.Join(errs...)
}
