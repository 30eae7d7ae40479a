package virtual

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// TestGPUSleepFigures measures Sleep and Wake of one large allocation
// (CUDAMEM_SLEEP_BYTES, default 16 GiB) beside the driver's own calls in
// the same run, alternated: the pinned copy each way into the same host
// memory (the bus), and cuMemUnmap plus cuMemRelease of the same chunk
// for a discarding sleep. It runs only with CUDAMEM_SLEEP_FIGURES=1 and
// prints "sleep-figures:" lines; it asserts only what must hold whatever
// the speed: the free memory after sleep and every byte after wake.
func TestGPUSleepFigures(t *testing.T) {
	if os.Getenv("CUDAMEM_SLEEP_FIGURES") != "1" {
		t.Skip("set CUDAMEM_SLEEP_FIGURES=1 to measure")
	}
	size := uint64(16 << 30)
	if v := os.Getenv("CUDAMEM_SLEEP_BYTES"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		size = n
	}
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	free, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if free < size+(2<<30) {
		t.Skipf("%d bytes free on the device, %d needed", free, size)
	}
	r, err := New(d, &Options{HandleType: HandleNone, Tag: "big"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Allocate(size, s)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer r.DropHostBackup()
	if err := k.Write(s, b.Ptr(), size, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	gbps := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e9 }
	// The first host sleep pins the backup; it is kept (KeepHostBackup),
	// so the pairs below copy into memory pinned already, as the
	// driver's copies do.
	t0 := time.Now()
	if err := r.Sleep(&SleepOptions{Backup: BackupToHost}, "big"); err != nil {
		t.Fatal(err)
	}
	first := time.Since(t0)
	if err := r.Wake(&WakeOptions{KeepHostBackup: true}, "big"); err != nil {
		t.Fatal(err)
	}
	t.Logf("sleep-figures: first host sleep (pins %d bytes): %v, %.1f GB/s", size, first, gbps(first))
	host := r.spare[:size]
	const reps = 5
	var sleepR, wakeR, discardR []float64
	for i := range reps {
		t0 = time.Now()
		if err := d.MemcpyDtoH(unsafe.Pointer(&host[0]), b.Ptr(), size); err != nil {
			t.Fatal(err)
		}
		dtoh := time.Since(t0)
		t0 = time.Now()
		if err := d.MemcpyHtoD(b.Ptr(), unsafe.Pointer(&host[0]), size); err != nil {
			t.Fatal(err)
		}
		htod := time.Since(t0)

		free0, _, _ := d.MemInfo()
		t0 = time.Now()
		if err := r.Sleep(&SleepOptions{Backup: BackupToHost}, "big"); err != nil {
			t.Fatal(err)
		}
		sl := time.Since(t0)
		free1, _, _ := d.MemInfo()
		if float64(free1)-float64(free0) < 0.99*float64(size) {
			t.Errorf("after sleep %d bytes more free, want at least 99%% of %d", int64(free1-free0), size)
		}
		t0 = time.Now()
		if err := r.Wake(&WakeOptions{KeepHostBackup: true}, "big"); err != nil {
			t.Fatal(err)
		}
		wk := time.Since(t0)
		if n, err := k.Check(s, b.Ptr(), size, 5); err != nil || n != 0 {
			t.Fatalf("after wake: %d bytes differ (%v)", n, err)
		}
		sleepR = append(sleepR, float64(dtoh)/float64(sl))
		wakeR = append(wakeR, float64(htod)/float64(wk))
		t.Logf("sleep-figures: rep %d: pinned DtoH %.1f GB/s, host sleep %.1f GB/s (%.2fx); pinned HtoD %.1f GB/s, wake %.1f GB/s (%.2fx)",
			i, gbps(dtoh), gbps(sl), float64(dtoh)/float64(sl), gbps(htod), gbps(wk), float64(htod)/float64(wk))

		// Discard: the driver's unmap and release of the same chunk
		// (mapped again, untimed), then our Sleep.
		raw, err := rawUnmapRelease(r, b.Ptr())
		if err != nil {
			t.Fatal(err)
		}
		t0 = time.Now()
		if err := r.Sleep(nil, "big"); err != nil {
			t.Fatal(err)
		}
		ds := time.Since(t0)
		if err := r.Wake(nil, "big"); err != nil {
			t.Fatal(err)
		}
		discardR = append(discardR, float64(ds)/float64(raw))
		t.Logf("sleep-figures: rep %d: driver unmap+release %v, discard sleep %v (%.2fx the driver's time)", i, raw, ds, float64(ds)/float64(raw))
		if err := k.Write(s, b.Ptr(), size, 5); err != nil { // discarded: write again
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	med := func(x []float64) float64 { x = slices.Clone(x); slices.Sort(x); return x[len(x)/2] }
	t.Logf("sleep-figures: median of %d pairs: host sleep %.2fx the pinned DtoH bandwidth, wake %.2fx the pinned HtoD bandwidth; discard sleep %.2fx the driver's unmap+release time (%d bytes)",
		reps, med(sleepR), med(wakeR), med(discardR), size)
}

// rawUnmapRelease times the driver's own unmap and release of the chunks
// of the allocation at p, then maps new chunks there again (untimed), so
// the allocation is as it was but for its contents.
func rawUnmapRelease(r *Resource, p cuda.DevicePtr) (time.Duration, error) {
	r.mu.Lock()
	a := r.allocs[p]
	r.mu.Unlock()
	t0 := time.Now()
	if err := r.drv.MemUnmap(a.base, a.mapped); err != nil {
		return 0, err
	}
	for _, c := range a.chunks {
		if err := r.drv.MemRelease(c.h); err != nil {
			return 0, err
		}
	}
	d := time.Since(t0)
	for i, c := range a.chunks {
		var t txn
		t.start()
		h, err := r.newChunk(&t, a.base+cuda.DevicePtr(c.off), c.size, a.descs)
		if err != nil {
			return 0, err
		}
		a.chunks[i].h = h
	}
	return d, nil
}

// TestGPUPinFigures compares cuMemHostAlloc with the pinning backups use
// (on Linux: pages touched in parallel, then registered), 4 GiB each
// (CUDAMEM_SLEEP_FIGURES=1).
func TestGPUPinFigures(t *testing.T) {
	if os.Getenv("CUDAMEM_SLEEP_FIGURES") != "1" {
		t.Skip("set CUDAMEM_SLEEP_FIGURES=1 to measure")
	}
	d := cudatest.Device(t)
	const size = uint64(4 << 30)
	gbps := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e9 }
	for range 2 {
		t0 := time.Now()
		p, err := d.MemHostAlloc(size, 0)
		if err != nil {
			t.Fatal(err)
		}
		alloc := time.Since(t0)
		t0 = time.Now()
		if err := d.MemFreeHost(p); err != nil {
			t.Fatal(err)
		}
		free := time.Since(t0)
		t0 = time.Now()
		mem, err := device{d}.hostAlloc(size)
		if err != nil {
			t.Fatal(err)
		}
		ours := time.Since(t0)
		t0 = time.Now()
		if err := (device{d}).hostFree(mem); err != nil {
			t.Fatal(err)
		}
		oursFree := time.Since(t0)
		t.Logf("sleep-figures: pinning %d bytes: cuMemHostAlloc %v (%.1f GB/s, freed in %v); the backup's pinning %v (%.1f GB/s, freed in %v)",
			size, alloc, gbps(alloc), free, ours, gbps(ours), oursFree)
	}
}
