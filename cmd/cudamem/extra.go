package main

import (
	"errors"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// extraMeasurements benchmarks the higher layers (resources, buffers)
// beside the C baseline of the driver calls underneath them.
func extraMeasurements(e *benchEnv) []measurement {
	var ms []measurement
	pool, err := resource.CurrentDevicePool(e.dev)
	if err == nil {
		for _, size := range []uint64{256, 1 << 20, 64 << 20} {
			ms = append(ms, measurement{
				name: "poolpair/resource/" + sizeLabel(size), baseline: "poolpair/cgo/" + sizeLabel(size), iters: 200_000,
				run: func(n int) (time.Duration, error) {
					return timed(n, e.stream, func() error {
						b, err := pool.Allocate(size, e.stream)
						if err != nil {
							return err
						}
						return b.Close()
					})
				},
			})
		}
	}
	if pool != nil {
		if sub, err := resource.NewSubAllocator(pool, nil); err == nil {
			e.cleanup = append(e.cleanup, sub.Close)
			for _, size := range []uint64{256, 1 << 20} {
				ms = append(ms, measurement{
					name: "poolpair/suballoc/" + sizeLabel(size), baseline: "poolpair/cgo/" + sizeLabel(size), iters: 200_000,
					run: func(n int) (time.Duration, error) {
						return timed(n, e.stream, func() error {
							b, err := sub.Allocate(size, e.stream)
							if err != nil {
								return err
							}
							return b.Close()
						})
					},
				})
			}
		}
	}
	ms = append(ms, pinnedMeasurements(e)...)
	ms = append(ms, bufferMeasurements(e)...)
	return ms
}

// pinnedMeasurements times pairs of pinned host memory: through a
// resource.PinnedPool (a host-location driver pool) and through a
// SubAllocator over one, beside the C pair on a host-location pool.
func pinnedMeasurements(e *benchEnv) []measurement {
	const size = 1 << 20
	var pool *resource.PinnedPool
	var sub *resource.SubAllocator
	var setupErr error
	ready := false
	setup := func() error {
		if ready {
			return setupErr
		}
		ready = true
		p, err := resource.NewPinnedPool(nil)
		if errors.Is(err, cuda.ErrNotSupported) {
			setupErr = skipf("no host-location pools here: %v", err)
			return setupErr
		}
		if err != nil {
			setupErr = err
			return err
		}
		e.cleanup = append(e.cleanup, p.Close)
		if sub, err = resource.NewSubAllocator(p, nil); err != nil {
			setupErr = err
			return err
		}
		e.cleanup = append(e.cleanup, sub.Close)
		pool = p
		return nil
	}
	pair := func(mr func() buffer.MemoryResource) func(n int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			r := mr()
			return timed(n, e.stream, func() error {
				b, err := buffer.Allocate(r, size, e.stream)
				if err != nil {
					return err
				}
				return b.Close()
			})
		}
	}
	return []measurement{
		// The baseline pool grants the device access, as PinnedPool does
		// (poolpair/hostpool/c is one that does not).
		{name: "poolpair/pinned/" + sizeLabel(size), baseline: "poolpair/hostpool_rw/c/" + sizeLabel(size), iters: 100_000,
			setup: setup, run: pair(func() buffer.MemoryResource { return pool })},
		// The raw driver pair on the PinnedPool's own pool: beside
		// poolpair/pinned it splits what the resource adds from what the
		// same two calls cost in this process.
		{name: "poolpair/go_pinned/" + sizeLabel(size), baseline: "poolpair/hostpool_rw/c/" + sizeLabel(size), iters: 100_000,
			setup: setup, run: func(n int) (time.Duration, error) {
				mp := pool.Pool()
				return timed(n, e.stream, func() error {
					p, err := e.stream.MemAllocFromPoolAsync(mp, size)
					if err != nil {
						return err
					}
					return e.stream.MemFreeAsync(p)
				})
			}},
		{name: "poolpair/suballoc_pinned/" + sizeLabel(size), baseline: "poolpair/hostpool_rw/c/" + sizeLabel(size), iters: 200_000,
			setup: setup, run: pair(func() buffer.MemoryResource { return sub })},
	}
}

// bufferMeasurements measures copies and fills through package buffer.
// Their buffers are made only when one of them is selected.
func bufferMeasurements(e *benchEnv) []measurement {
	s := e.stream
	var host, a, b *buffer.Buffer
	var pageable, fresh []byte
	var setupErr error
	ready := false
	setup := func() error {
		if ready {
			return setupErr
		}
		ready = true
		pinnedMR, err := resource.NewLegacyPinned()
		if err != nil {
			setupErr = err
			return err
		}
		devMR, err := resource.CurrentDevicePool(e.dev)
		if err != nil {
			setupErr = err
			return err
		}
		var bufs []*buffer.Buffer
		e.cleanup = append(e.cleanup, func() error {
			var errs []error
			for _, b := range bufs {
				errs = append(errs, b.Close())
			}
			return errors.Join(errs...)
		})
		for _, p := range []struct {
			dst **buffer.Buffer
			mr  buffer.MemoryResource
		}{{&host, pinnedMR}, {&a, devMR}, {&b, devMR}} {
			buf, err := buffer.Allocate(p.mr, copyBytes, s)
			if err != nil {
				setupErr = err
				return err
			}
			bufs = append(bufs, buf)
			*p.dst = buf
		}
		pageable = make([]byte, copyBytes)
		for i := range pageable {
			pageable[i] = byte(i)
		}
		// Outside the Go heap, as the host-copy measurements' memory
		// (see hostMemory); pageable stays a Go slice, as before.
		m, free, err := hostMemory(copyBytes)
		if err != nil {
			setupErr = err
			return err
		}
		e.cleanup = append(e.cleanup, free)
		fresh = m
		return nil
	}
	// The copies from and to Go memory run with the run's staging
	// parameters (the sweeps change them).
	staged := func(f func() error) func(n int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			if err := useStaging(e.staging); err != nil {
				return 0, err
			}
			return timed(n, s, f)
		}
	}
	return []measurement{
		{name: "copy/htod_pinned/buffer", baseline: "copy/htod_pinned", iters: 20, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return host.CopyTo(a, s) })
			}},
		{name: "copy/dtoh_pinned/buffer", baseline: "copy/dtoh_pinned", iters: 20, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return a.CopyTo(host, s) })
			}},
		{name: "copy/dtod/buffer", baseline: "copy/dtod", iters: 80, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return a.CopyTo(b, s) })
			}},
		{name: "fill/d32/buffer", baseline: "fill/d32", iters: 80, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return a.Fill32(0x01020304, s) })
			}},
		{name: "copy/htod_pageable/buffer", baseline: "copy/htod_pageable", iters: 20, bytes: copyBytes, setup: setup,
			run: staged(func() error { return buffer.CopyFromHost(a, pageable, s) })},
		{name: "copy/dtoh_pageable/buffer", baseline: "copy/dtoh_pageable", iters: 20, bytes: copyBytes, setup: setup,
			run: staged(func() error { return buffer.CopyToHost(pageable, a, s) })},
		// Into a slice whose pages are fresh at every copy (released,
		// untimed, before each): the first touch is counted.
		{name: "copy/dtoh_pageable_fresh/buffer", baseline: "copy/dtoh_pageable", iters: 20, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				if err := useStaging(e.staging); err != nil {
					return 0, err
				}
				var total time.Duration
				for range n {
					if !releasePages(fresh) {
						return 0, skipf("cannot release pages here (madvise MADV_DONTNEED is Linux's)")
					}
					t := time.Now()
					if err := buffer.CopyToHost(fresh, a, s); err != nil {
						return 0, err
					}
					total += time.Since(t)
				}
				return total, nil
			}},
	}
}
