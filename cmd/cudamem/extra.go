package main

import (
	"errors"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/resource"
)

// extraMeasurements benchmarks the higher layers (resources, buffers)
// beside the C baseline of the driver calls underneath them.
func extraMeasurements(e *benchEnv) []measurement {
	var ms []measurement
	pool, err := resource.NewDevicePool(e.dev, nil)
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
	ms = append(ms, bufferMeasurements(e)...)
	return ms
}

// bufferMeasurements measures copies and fills through package buffer.
func bufferMeasurements(e *benchEnv) []measurement {
	s := e.stream
	pinnedMR, err := resource.NewLegacyPinned()
	if err != nil {
		return nil
	}
	devMR, err := resource.NewDevicePool(e.dev, nil)
	if err != nil {
		return nil
	}
	var bufs []*buffer.Buffer
	alloc := func(mr buffer.MemoryResource) *buffer.Buffer {
		b, err := mr.Allocate(copyBytes, s)
		if err != nil {
			return nil
		}
		bufs = append(bufs, b)
		return b
	}
	host, a, b := alloc(pinnedMR), alloc(devMR), alloc(devMR)
	e.cleanup = append(e.cleanup, func() error {
		var errs []error
		for _, b := range bufs {
			errs = append(errs, b.Close())
		}
		return errors.Join(errs...)
	})
	if host == nil || a == nil || b == nil {
		return nil
	}
	pageable := make([]byte, copyBytes)
	for i := range pageable {
		pageable[i] = byte(i)
	}
	return []measurement{
		{name: "copy/htod_pinned/buffer", baseline: "copy/htod_pinned", iters: 20, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return host.CopyTo(a, s) })
			}},
		{name: "copy/dtoh_pinned/buffer", baseline: "copy/dtoh_pinned", iters: 20, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return a.CopyTo(host, s) })
			}},
		{name: "copy/dtod/buffer", baseline: "copy/dtod", iters: 80, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return a.CopyTo(b, s) })
			}},
		{name: "fill/d32/buffer", baseline: "fill/d32", iters: 80, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return a.Fill32(0x01020304, s) })
			}},
		{name: "copy/htod_pageable/buffer", baseline: "copy/htod_pageable", iters: 20, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return buffer.CopyFromHost(a, pageable, s) })
			}},
		{name: "copy/dtoh_pageable/buffer", baseline: "copy/dtoh_pageable", iters: 20, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return buffer.CopyToHost(pageable, a, s) })
			}},
	}
}
