// Command grow-array keeps a growing array of uint32 in GPU virtual memory.
//
// Values are appended in batches; when the array is full it grows by one
// physical chunk through virtual.Resource.Grow: in place while its address
// reservation has room (here 8 chunks), then in place again if the driver
// grants the addresses after it, else by mapping the same chunks at a new,
// larger range. No byte is ever copied. At the end the whole array is read
// back and every value checked; it prints OK with how often the array
// moved.
//
// It needs a device with virtual memory management; without a driver it
// says what was tried and exits 1. It takes no flags: -h prints its usage.
//
//	go run ./examples/grow-array
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/virtual"
)

const usage = `usage: grow-array

Grows an array of uint32 in GPU virtual memory, in place and by
remapping, never copying, and checks every value. It takes no flags.
`

func main() {
	fs := flag.NewFlagSet("grow-array", flag.ContinueOnError)
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
		fmt.Fprintf(os.Stderr, "grow-array: %v\n%s", err, usage)
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grow-array:", err)
		os.Exit(1)
	}
}

// Array is a growable []uint32 in device memory.
type Array struct {
	mr  *virtual.Resource
	buf *buffer.Buffer
	len uint64 // values in use
	s   *cuda.Stream
}

// Append copies vs to the end of the array, growing it as needed.
func (a *Array) Append(vs []uint32) (moved bool, err error) {
	need := (a.len + uint64(len(vs))) * 4
	if need > a.buf.Size() {
		g := a.mr.Granularity()
		before := a.buf.Ptr()
		grown, err := a.mr.Grow(a.buf, (need+g-1)/g*g)
		if grown == nil {
			return false, err // not grown; a.buf is as it was
		}
		a.buf = grown // a.buf was consumed
		if err != nil && !errors.Is(err, buffer.ErrPartlyFreed) {
			return false, err
		}
		moved = grown.Ptr() != before
	}
	tail, err := a.buf.Slice(a.len*4, uint64(len(vs))*4)
	if err != nil {
		return moved, err
	}
	if err := buffer.CopyFromHost(tail, vs, a.s); err != nil {
		return moved, err
	}
	a.len += uint64(len(vs))
	return moved, nil
}

func value(i uint64) uint32 { return uint32(i*2654435761) ^ 0x5a5a5a5a }

func run() (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	probe, err := virtual.New(dev, &virtual.Options{HandleType: virtual.HandleNone})
	if errors.Is(err, cuda.ErrNotSupported) {
		return fmt.Errorf("%v has no virtual memory management: %w", dev, err)
	}
	if err != nil {
		return err
	}
	chunk := probe.Granularity()
	mr, err := virtual.New(dev, &virtual.Options{HandleType: virtual.HandleNone, Reserve: 8 * chunk})
	if err != nil {
		return err
	}
	buf, err := mr.Allocate(chunk, s)
	if err != nil {
		return err
	}
	a := &Array{mr: mr, buf: buf, s: s}
	defer func() { err = errors.Join(err, a.buf.Close()) }()

	const batch = 100_000 // values per Append: not a multiple of a chunk
	total := 24 * chunk / 4
	moves := 0
	vs := make([]uint32, batch)
	for a.len < total {
		n := min(uint64(batch), total-a.len)
		for i := range n {
			vs[i] = value(a.len + i)
		}
		moved, err := a.Append(vs[:n])
		if err != nil {
			return fmt.Errorf("append at %d: %w", a.len, err)
		}
		if moved {
			moves++
		}
	}
	info, err := mr.Info(a.buf)
	if err != nil {
		return err
	}
	got := make([]uint32, a.len)
	whole, err := a.buf.Slice(0, a.len*4)
	if err != nil {
		return err
	}
	if err := buffer.CopyToHost(got, whole, s); err != nil {
		return err
	}
	for i, v := range got {
		if want := value(uint64(i)); v != want {
			return fmt.Errorf("value %d is %#x after growing, want %#x", i, v, want)
		}
	}
	fmt.Printf("OK: %d values (%d MiB) in %d chunks, grown without copying; moved %d times\n",
		a.len, info.Size>>20, info.Chunks, moves)
	return nil
}
