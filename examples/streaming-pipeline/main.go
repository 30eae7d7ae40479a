// Command streaming-pipeline streams batches through the GPU with a
// sub-allocator serving every scratch buffer.
//
// Three workers, each with its own stream, take batches from a channel.
// For each batch a worker allocates an input and an output buffer from a
// shared resource.SubAllocator (over the device's pool, with a
// resource.Statistics adaptor on top), uploads the batch, runs a device
// stage (here a device-to-device copy into the output, then a fill of its
// last word with the batch number), downloads the result and checks it,
// and frees both buffers in stream order. After the first few batches the
// sub-allocator serves every request from the blocks it already holds: no
// driver allocation at all. It prints OK with the peak memory and how many
// blocks the sub-allocator took from the pool.
//
// Without a driver it says what was tried and exits 1. It takes no
// flags: -h prints its usage.
//
//	go run ./examples/streaming-pipeline
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

const (
	batches   = 96
	workers   = 3
	batchLen  = 256 << 10 // uint32 values per batch (1 MiB)
	batchSize = batchLen * 4
)

const usage = `usage: streaming-pipeline

Streams batches through the GPU on three workers' streams, with a shared
sub-allocator serving every buffer, and checks every batch. It takes no
flags.
`

func main() {
	fs := flag.NewFlagSet("streaming-pipeline", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the errors are printed below, once
	err := fs.Parse(os.Args[1:])
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("takes no arguments, got %q", fs.Args())
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(os.Stderr, usage)
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "streaming-pipeline: %v\n%s", err, usage)
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "streaming-pipeline:", err)
		os.Exit(1)
	}
}

func input(batch int) []uint32 {
	in := make([]uint32, batchLen)
	for i := range in {
		in[i] = uint32(batch)<<20 ^ uint32(i)*2654435761
	}
	return in
}

// stage runs one batch on s: upload, device stage, download, check.
func stage(mr buffer.MemoryResource, s *cuda.Stream, batch int, out []uint32) (err error) {
	in := input(batch)
	src, err := buffer.Allocate(mr, batchSize, s) // usable on s at once
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, src.Close()) }() // freed in order on s
	dst, err := buffer.Allocate(mr, batchSize, s)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dst.Close()) }()

	if err := buffer.CopyFromHost(src, in, s); err != nil {
		return err
	}
	if err := src.CopyTo(dst, s); err != nil {
		return err
	}
	last, err := dst.Slice(batchSize-4, 4)
	if err != nil {
		return err
	}
	if err := last.Fill32(uint32(batch), s); err != nil {
		return err
	}
	if err := buffer.CopyToHost(out, dst, s); err != nil { // waits for s
		return err
	}
	in[batchLen-1] = uint32(batch)
	for i := range out {
		if out[i] != in[i] {
			return fmt.Errorf("batch %d: value %d is %#x, want %#x", batch, i, out[i], in[i])
		}
	}
	return nil
}

func run() (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	// The streams outlive the sub-allocator: its Close, deferred after
	// theirs, runs first and may still order frees on them.
	streams := make([]*cuda.Stream, workers)
	for i := range streams {
		if streams[i], err = dev.NewStream(); err != nil {
			return err
		}
		defer func(s *cuda.Stream) { err = errors.Join(err, s.Close()) }(streams[i])
	}
	pool, err := resource.Default(dev) // the device's pool (or cuMemAlloc without pools)
	if err != nil {
		return err
	}
	sub, err := resource.NewSubAllocator(pool, &resource.SubAllocatorOptions{GrowSize: 8 << 20, MaxSize: 256 << 20})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sub.Close()) }()
	mr := resource.NewStatistics(sub)

	work := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]uint32, batchLen)
			var failed error
			for b := range work {
				if failed == nil {
					failed = stage(mr, s, b, out)
				}
			}
			errs <- errors.Join(failed, s.Sync())
		}()
	}
	for b := range batches {
		work <- b
	}
	close(work)
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	if err != nil {
		return err
	}
	st, sa := mr.Stats(), sub.Stats()
	if st.CurrentCount != 0 || sa.Allocations != 0 {
		return fmt.Errorf("%d allocations still live after the pipeline", st.CurrentCount)
	}
	fmt.Printf("OK: %d batches of %d MiB checked by %d workers; %d allocations, peak %d MiB live, %d blocks (%d MiB) from the pool\n",
		batches, batchSize>>20, workers, st.TotalCount, st.PeakBytes>>20, sa.Blocks, sa.Reserved>>20)
	return nil
}
