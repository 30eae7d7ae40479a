package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/virtual"
)

// The virtual-memory measurements, through virtual.Resource with the
// options that match the C baseline (pinned device memory, POSIX-fd
// handle type, recommended granularity, read-write access).
//
//   - vmm/allocfree/SIZE: Allocate + Close of one allocation: reserve,
//     create, map, set access; then wait for the (idle) stream, unmap,
//     release, free the range.
//   - vmm/growstep/toSIZE/first16 and .../last16: one allocation grown by
//     2 MiB steps inside one reservation (Options.Reserve) from 2 MiB to
//     SIZE (-grow-to); the time per Grow over the first 16 steps and over
//     the last 16. Each step is one create, map and set access.
const (
	vmmStep      = 2 << 20
	vmmWindow    = 16       // steps averaged at each end of a grow
	vmmMemMargin = 1 << 30  // free memory left untouched when deciding to skip
	minGrowTo    = 80 << 20 // room for two windows of steps
)

func vmmMeasurements(e *benchEnv) []measurement {
	var res, growRes *virtual.Resource
	var resErr error
	ready := false
	resources := func() error {
		if ready {
			return resErr
		}
		ready = true
		var err error
		res, err = virtual.New(e.dev, &virtual.Options{HandleType: virtual.HandlePosixFD})
		if err == nil {
			growRes, err = virtual.New(e.dev, &virtual.Options{HandleType: virtual.HandlePosixFD, Reserve: e.growTo})
		}
		if errors.Is(err, cuda.ErrNotSupported) {
			resErr = skipf("%v", err)
		} else {
			resErr = err
		}
		return resErr
	}
	fits := func(size uint64) error {
		free, _, err := e.dev.MemInfo()
		if err != nil {
			return err
		}
		if size+vmmMemMargin > free {
			return skipf("needs %s of device memory plus %s spare, and %v has %s free", sizeLabel(size), sizeLabel(vmmMemMargin), e.dev, fmtBytes(free))
		}
		return nil
	}
	var ms []measurement
	for _, sz := range []struct {
		size  uint64
		iters int
	}{{2 << 20, 500}, {64 << 20, 100}, {1 << 30, 20}, {16 << 30, 4}} {
		size := sz.size
		ms = append(ms, measurement{
			name: "vmm/allocfree/" + sizeLabel(size), baseline: "vmm/allocfree/c/" + sizeLabel(size), iters: sz.iters,
			setup: func() error {
				if err := resources(); err != nil {
					return err
				}
				return fits(size)
			},
			run: func(n int) (time.Duration, error) {
				d, err := timed(n, nil, func() error {
					b, err := res.Allocate(size, e.stream)
					if err != nil {
						return err
					}
					return b.Close()
				})
				return d, oomSkip(err, size)
			},
		})
	}
	grow := growStepPrefix(e.growTo)
	last := &side{name: grow + "/last16", baseline: "vmm/growstep/c/to" + sizeLabel(e.growTo) + "/last16"}
	ms = append(ms, measurement{
		name: grow + "/first16", baseline: "vmm/growstep/c/to" + sizeLabel(e.growTo) + "/first16", iters: 1, perIter: vmmWindow,
		sides: []*side{last},
		setup: func() error {
			if err := resources(); err != nil {
				return err
			}
			return fits(e.growTo)
		},
		run: func(n int) (time.Duration, error) {
			var first time.Duration
			last.d = 0
			for i := 0; i < n; i++ {
				f, l, err := growSteps(growRes, e.stream, e.growTo)
				if err != nil {
					return 0, oomSkip(err, e.growTo)
				}
				first += f
				last.d += l
			}
			return first, nil
		},
	})
	return ms
}

// growSteps grows one allocation from one step to total, a step at a
// time, and returns the time the first and the last vmmWindow steps took.
func growSteps(r *virtual.Resource, s *cuda.Stream, total uint64) (first, last time.Duration, err error) {
	step := max(vmmStep, r.Granularity())
	b, err := r.Allocate(step, s)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if b != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	steps := int(total/step) - 1 // growths after the first chunk
	if steps < 2*vmmWindow {
		return 0, 0, fmt.Errorf("-grow-to %s is only %d steps of %s: want at least %d", sizeLabel(total), steps+1, sizeLabel(step), 2*vmmWindow+1)
	}
	for i := 1; i <= steps; i++ {
		t0 := time.Now()
		nb, err := r.Grow(b, uint64(i+1)*step)
		dt := time.Since(t0)
		if nb != nil {
			b = nb
		}
		if err != nil {
			return 0, 0, err
		}
		if i <= vmmWindow {
			first += dt
		}
		if i > steps-vmmWindow {
			last += dt
		}
	}
	return first, last, nil
}

// oomSkip turns running out of device memory into a skip.
func oomSkip(err error, size uint64) error {
	if errors.Is(err, cuda.ErrorOutOfMemory) {
		return skipf("out of device memory at %s: %v", sizeLabel(size), err)
	}
	return err
}

// fmtBytes formats a byte count in GiB or MiB.
func fmtBytes(n uint64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// growStepPrefix is the start of the names of the vmm/growstep
// measurements for a -grow-to of size.
func growStepPrefix(size uint64) string { return "vmm/growstep/to" + sizeLabel(size) }

// growStepName is the vmm/growstep measurement's name for a -grow-to of
// size (its side figure is .../last16).
func growStepName(size uint64) string { return growStepPrefix(size) + "/first16" }
