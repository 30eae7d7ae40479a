package main

import (
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// The batched-copy measurements: batch/{htod,dtod}/go is one
// buffer.CopyBatch of 10,000 copies of 4 KiB per iteration (from pinned
// memory to the device, or device to device), block i of the source to
// block i*7919 mod 10,000 of the destination; its baseline is the same
// batch as one cuMemcpyBatchAsync call from C. batch/{htod,dtod}/go_loop
// is the same copies as one cuMemcpyAsync each (Stream.MemcpyAsync),
// against the C loop. ns/op is per copy.
const (
	batchCopies = 10_000
	batchBlock  = 4 << 10
)

func batchMeasurements(e *benchEnv) []measurement {
	d, s := e.dev, e.stream
	const size = batchCopies * batchBlock
	var hsrc, dsrc, dst *buffer.Buffer
	ready := false
	setup := func() error {
		if ready {
			return nil
		}
		h, err := d.MemHostAlloc(size, cuda.MemHostAllocPortable)
		if err != nil {
			return err
		}
		e.cleanup = append(e.cleanup, func() error { return d.MemFreeHost(h) })
		a, err := d.MemAlloc(size)
		if err != nil {
			return err
		}
		e.cleanup = append(e.cleanup, func() error { return d.MemFree(a) })
		b, err := d.MemAlloc(size)
		if err != nil {
			return err
		}
		e.cleanup = append(e.cleanup, func() error { return d.MemFree(b) })
		hsrc = buffer.FromPointer(cuda.DevicePtr(uintptr(h)), size)
		dsrc, dst = buffer.FromPointer(a, size), buffer.FromPointer(b, size)
		ready = true
		return nil
	}
	layout := func(src *buffer.Buffer) []buffer.Copy {
		copies := make([]buffer.Copy, batchCopies)
		for i := range copies {
			j := uint64(i) * 7919 % batchCopies
			copies[i] = buffer.Copy{Dst: dst, Src: src, DstOffset: j * batchBlock, SrcOffset: uint64(i) * batchBlock, Size: batchBlock}
		}
		return copies
	}
	skip := ""
	if d.MemcpyBatchPath() == cuda.MemcpyBatchLoop {
		skip = "the driver has no cuMemcpyBatchAsync (CUDA 12.8 and later)"
	}
	var ms []measurement
	for _, dir := range []string{"htod", "dtod"} {
		src := func() *buffer.Buffer {
			if dir == "htod" {
				return hsrc
			}
			return dsrc
		}
		ms = append(ms,
			measurement{name: "batch/" + dir + "/go", baseline: "batch/" + dir + "/c_batched", iters: 20, perIter: batchCopies,
				bytes: size, setup: setup, skip: skip,
				run: func(n int) (time.Duration, error) {
					copies := layout(src())
					return timed(n, s, func() error { return buffer.CopyBatch(s, copies) })
				}},
			measurement{name: "batch/" + dir + "/go_loop", baseline: "batch/" + dir + "/c_loop", iters: 20, perIter: batchCopies,
				bytes: size, setup: setup,
				run: func(n int) (time.Duration, error) {
					copies := layout(src())
					return timed(n, s, func() error {
						for _, c := range copies {
							if err := s.MemcpyAsync(c.Dst.Ptr()+cuda.DevicePtr(c.DstOffset), c.Src.Ptr()+cuda.DevicePtr(c.SrcOffset), c.Size); err != nil {
								return err
							}
						}
						return nil
					})
				}},
		)
	}
	return ms
}
