package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/kernels"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// pattern is what the pattern kernels write: byte i is byte(uint32(i)*31 + seed).
// selftest proves with the kernels what the device itself reads and writes.
func pattern(n int, seed uint32) []byte { return kernels.Pattern(n, seed) }

// deviceKit is one device's stream and kernels.
type deviceKit struct {
	dev          *cuda.Device
	s            *cuda.Stream
	mod          *cuda.Module
	write, check *cuda.Function
}

func newKit(d *cuda.Device) (*deviceKit, error) {
	s, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	m, err := d.LoadModule(kernels.PTX())
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	k := &deviceKit{dev: d, s: s, mod: m}
	if k.write, err = m.Function(kernels.PatternWrite); err == nil {
		k.check, err = m.Function(kernels.PatternCheck)
	}
	if err != nil {
		return nil, errors.Join(err, k.close())
	}
	return k, nil
}

// close unloads the kit's kernels and destroys its stream.
func (k *deviceKit) close() error {
	return errors.Join(k.mod.Close(), k.s.Close())
}

var grid, block = cuda.Dim3{X: 264}, cuda.Dim3{X: 256}

// deviceWrite writes the pattern for seed into b from a kernel on k's device.
func (k *deviceKit) deviceWrite(b *buffer.Buffer, seed uint32) error {
	return k.write.Launch(k.s, grid, block, 0, b.Ptr(), b.Size(), seed)
}

// deviceCheck counts, on the device, the bytes of b that differ from the
// pattern for seed.
func (k *deviceKit) deviceCheck(b *buffer.Buffer, seed uint32) (err error) {
	counter, err := k.dev.MemAlloc(4)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, k.dev.MemFree(counter)) }()
	if err := k.s.MemsetD32Async(counter, 0, 1); err != nil {
		return err
	}
	if err := k.check.Launch(k.s, grid, block, 0, b.Ptr(), b.Size(), seed, counter); err != nil {
		return err
	}
	out := make([]uint32, 1)
	if err := buffer.CopyToHost(out, buffer.FromPointer(counter, 4), k.s); err != nil {
		return err
	}
	if out[0] != 0 {
		return fmt.Errorf("the device sees %d of %d bytes wrong", out[0], b.Size())
	}
	return nil
}

// closeInto closes c and joins its error into *err: a deferred Close
// whose failure must not be lost.
func closeInto(err *error, c io.Closer) {
	*err = errors.Join(*err, c.Close())
}

func hostCheck(got []byte, seed uint32) error {
	if want := pattern(len(got), seed); !bytes.Equal(got, want) {
		return errors.New("the host reads different bytes than were written")
	}
	return nil
}

type step struct {
	name string
	run  func() error
}

func runSelftest(args []string, w, stderr io.Writer) (err error) {
	fs := newFlagSet("selftest", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	}
	devs, err := cuda.Devices()
	if err != nil {
		return describeLoadError(err)
	}
	if len(devs) == 0 {
		return errors.New("no CUDA devices")
	}
	fake := false
	if path, _, err := cuda.Driver(); err == nil && isFake(path) {
		// Say so first: these checks then test cudamem, not a GPU.
		fake = true
		fmt.Fprintf(w, "driver: %s\n", fakeNote)
	}
	kits := make([]*deviceKit, len(devs))
	for i, d := range devs {
		if kits[i], err = newKit(d); err != nil {
			return fmt.Errorf("%v: %w", d, err)
		}
		defer func(k *deviceKit) { err = errors.Join(err, k.close()) }(kits[i])
	}
	var steps []step
	for _, k := range kits {
		steps = append(steps, deviceSteps(k)...)
	}
	for _, a := range kits {
		for _, b := range kits {
			if a != b {
				steps = append(steps, peerStep(a, b))
			}
		}
	}
	failed := runSteps(w, steps)
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(steps))
	}
	if fake {
		fmt.Fprintf(w, "all %d checks passed, on the fake driver\n", len(steps))
		return nil
	}
	fmt.Fprintf(w, "all %d checks passed\n", len(steps))
	return nil
}

// runSteps runs the checks, printing a line for each: ok, skip (the
// device or driver lacks the feature; the error says which) or FAIL with
// the error. It returns how many failed.
func runSteps(w io.Writer, steps []step) (failed int) {
	for _, st := range steps {
		start := time.Now()
		err := st.run()
		status := "ok  "
		switch {
		case errors.Is(err, cuda.ErrNotSupported):
			status = "skip" // the error says what is not supported
		case err != nil:
			status = "FAIL"
			failed++
		}
		fmt.Fprintf(w, "%s %-44s %8.2f ms", status, st.name, float64(time.Since(start).Microseconds())/1000)
		if err != nil {
			fmt.Fprintf(w, "  %v", err)
		}
		fmt.Fprintln(w)
	}
	return failed
}

const selfSize = 16 << 20

func deviceSteps(k *deviceKit) []step {
	d := k.dev
	return []step{
		{d.String() + ": device pool, host and device agree", func() (err error) {
			pool, err := resource.CurrentDevicePool(d)
			if err != nil {
				return err
			}
			defer closeInto(&err, pool)
			b, err := pool.Allocate(selfSize, k.s)
			if err != nil {
				return err
			}
			defer closeInto(&err, b)
			if err := buffer.CopyFromHost(b, pattern(selfSize, 1), k.s); err != nil {
				return err
			}
			if err := k.deviceCheck(b, 1); err != nil {
				return err
			}
			if err := k.deviceWrite(b, 2); err != nil {
				return err
			}
			got := make([]byte, selfSize)
			if err := buffer.CopyToHost(got, b, k.s); err != nil {
				return err
			}
			return hostCheck(got, 2)
		}},
		{d.String() + ": pinned host memory seen by the device", func() (err error) {
			mr, err := resource.NewLegacyPinned()
			if err != nil {
				return err
			}
			b, err := buffer.Allocate(mr, 1<<20, k.s)
			if err != nil {
				return err
			}
			defer closeInto(&err, b)
			if err := k.deviceWrite(b, 3); err != nil {
				return err
			}
			if err := k.s.Sync(); err != nil {
				return err
			}
			view, err := b.Bytes()
			if err != nil {
				return err
			}
			return hostCheck(view, 3)
		}},
		{d.String() + ": managed memory, host then device", func() (err error) {
			mr, err := resource.NewManaged(d, nil)
			if err != nil {
				return err
			}
			b, err := buffer.Allocate(mr, 1<<20, k.s)
			if err != nil {
				return err
			}
			defer closeInto(&err, b)
			view, err := b.Bytes()
			if err != nil {
				return err
			}
			copy(view, pattern(len(view), 4))
			return k.deviceCheck(b, 4)
		}},
		{d.String() + ": virtual memory grows and keeps its data", func() (err error) {
			r, err := virtual.New(d, nil)
			if err != nil {
				return err
			}
			b, err := buffer.Allocate(r, r.Granularity(), k.s)
			if err != nil {
				return err
			}
			if err := k.deviceWrite(b, 5); err != nil {
				return errors.Join(err, b.Close())
			}
			g, err := r.Grow(b, 3*r.Granularity())
			if err != nil {
				return errors.Join(err, b.Close())
			}
			defer closeInto(&err, g)
			head, err := g.Slice(0, r.Granularity())
			if err != nil {
				return err
			}
			return k.deviceCheck(head, 5)
		}},
	}
}

func peerStep(src, dst *deviceKit) step {
	return step{fmt.Sprintf("%v -> %v: peer copy", src.dev, dst.dev), func() (err error) {
		a, err := resource.Default(src.dev)
		if err != nil {
			return err
		}
		b, err := resource.Default(dst.dev)
		if err != nil {
			return err
		}
		sb, err := buffer.Allocate(a, selfSize, src.s)
		if err != nil {
			return err
		}
		defer closeInto(&err, sb)
		db, err := buffer.Allocate(b, selfSize, dst.s)
		if err != nil {
			return err
		}
		defer closeInto(&err, db)
		if err := src.deviceWrite(sb, 6); err != nil {
			return err
		}
		if err := src.s.Sync(); err != nil {
			return err
		}
		if err := db.CopyFrom(sb, dst.s); err != nil {
			return err
		}
		return dst.deviceCheck(db, 6)
	}}
}
