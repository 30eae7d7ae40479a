//go:build cudamemfault && linux

package faultsweep

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/virtual"
)

// vmmFixture is a virtual resource and a buffer of chunks*granularity
// bytes (grown chunk by chunk, so it holds that many physical
// allocations) filled with a pattern.
type vmmFixture struct {
	cl   closers
	r    *virtual.Resource
	s    *cuda.Stream
	b    *buffer.Buffer
	gran uint64
	want []byte
}

func newVMM(opts *virtual.Options, chunks uint64) (*vmmFixture, error) {
	f := &vmmFixture{}
	var err error
	if f.r, err = virtual.New(dev0(), opts); err != nil {
		return nil, err
	}
	f.gran = f.r.Granularity()
	if f.s, err = newStream(&f.cl, 0); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	if f.b, err = f.r.Allocate(f.gran, f.s); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	for i := uint64(2); i <= chunks; i++ {
		nb, err := f.r.Grow(f.b, i*f.gran)
		if err != nil {
			return nil, joinSetup(joinClose(err, closers{f.b.Close}), f.cl)
		}
		f.b = nb
	}
	f.cl.add(func() error { return f.b.Close() })
	f.want = pattern(int(f.b.Size()), 11)
	if err := write(f.b, f.s, 11); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	return f, nil
}

// resize sweeps Grow or Shrink of f.b to n chunks. Their contract (see
// package virtual, "Failures"):
//   - a nil buffer with an error: the resize did not happen; the old
//     buffer is open and intact (or the error says it was closed);
//   - a new buffer with an error wrapping buffer.ErrPartlyFreed: the
//     resize took effect (the old buffer is consumed; the new one is the
//     one to use and close) but something no longer needed could not be
//     given back; it is kept, and Reclaim gives it back once the driver
//     works again;
//   - a new buffer and no error: done.
//
// After a resize that took effect the new buffer must hold the old data's
// prefix and work throughout, and after Reclaim and the cleanup everything
// must be back to the baseline.
func resize(name string, opts func() *virtual.Options, chunks, to uint64, block bool) sweepCase {
	var absorbed map[string]string
	if to > chunks {
		// Grow first asks for the range right after the allocation; when it
		// cannot have it, remapping to a new range is the documented plan B.
		absorbed = map[string]string{"cuMemAddressReserve": "Grow tries the adjacent range first, then remaps"}
	}
	return sweepCase{name: name, absorbed: absorbed, setup: func() (*fixture, error) {
		f, err := newVMM(opts(), chunks)
		if err != nil {
			return nil, err
		}
		if block {
			// Take the address space after the buffer, so Grow must remap.
			d := dev0()
			end := f.b.Ptr() + cuda.DevicePtr(f.b.Size())
			blk, err := d.MemAddressReserve(f.gran, f.gran, end)
			if err != nil {
				return nil, joinSetup(err, f.cl)
			}
			f.cl.add(func() error { return d.MemAddressFree(blk, f.gran) })
		}
		old := f.b
		var nb *buffer.Buffer
		var opErr error
		var before string // the allocation's layout before the op
		op := func() (err error) {
			if to > chunks {
				nb, err = f.r.Grow(old, to*f.gran)
			} else {
				nb, err = f.r.Shrink(old, to*f.gran)
			}
			if nb != nil {
				f.b = nb // took effect: the new buffer is the one to close
			}
			opErr = err
			return err
		}
		return &fixture{
			op: op,
			verify: func() error {
				if nb == nil {
					if errors.Is(opErr, buffer.ErrPartlyFreed) {
						return fmt.Errorf("no buffer returned, but the error says the resize took effect: %w", opErr)
					}
					if old.IsClosed() {
						return nil // closed, and the error said so: nothing left to use
					}
					if err := check(old, f.s, f.want); err != nil {
						return fmt.Errorf("failed resize left the buffer broken: %w", err)
					}
					if err := op(); err != nil {
						return fmt.Errorf("resize fails after the failure: %w", err)
					}
				} else if opErr != nil {
					if !errors.Is(opErr, buffer.ErrPartlyFreed) {
						return fmt.Errorf("a buffer returned with an error that does not wrap buffer.ErrPartlyFreed: %w", opErr)
					}
					if !old.IsClosed() {
						return errors.New("the resize took effect but the old buffer is still open")
					}
					// The fault has passed: what was kept must go back now.
					if err := f.r.Reclaim(); err != nil {
						return fmt.Errorf("Reclaim after a resize that took effect: %w", err)
					}
				}
				keep := min(chunks, to) * f.gran
				got := make([]byte, keep)
				if _, err := nb.ReadAt(got, 0); err != nil {
					return err
				}
				if string(got) != string(f.want[:keep]) {
					return errors.New("data lost in the resize")
				}
				return roundTrip(nb, f.s, 12)
			},
			cleanup: func() error { return f.cl.run() },
			state: func() string {
				if nb != nil && errors.Is(opErr, buffer.ErrPartlyFreed) {
					// Took effect, as documented: not a failed operation,
					// so there is no earlier state to keep (verify checks
					// this outcome instead).
					return before
				}
				i, err := f.r.Info(old)
				if err != nil {
					return "closed"
				}
				before = fmt.Sprintf("%+v", i)
				return before
			},
		}, nil
	}}
}

// TestFaultSweepVirtual: VMM allocate (in TestFaultSweepAllocate), grow in
// place and by remapping, shrink, export, import and access changes.
func TestFaultSweepVirtual(t *testing.T) {
	reserve := func() *virtual.Options { return &virtual.Options{Reserve: 64 << 20} }
	plain := func() *virtual.Options { return nil }
	fd := func() *virtual.Options { return &virtual.Options{HandleType: virtual.HandlePosixFD} }
	cases := []sweepCase{
		resize("virtual Grow in place", reserve, 1, 3, false),
		resize("virtual Grow remap", plain, 2, 4, true),
		resize("virtual Shrink", plain, 3, 1, false),
		{name: "virtual Export", setup: func() (*fixture, error) {
			f, err := newVMM(fd(), 2)
			if err != nil {
				return nil, err
			}
			var chunks []virtual.Chunk
			return &fixture{
				op: func() (err error) { chunks, err = f.r.Export(f.b); return err },
				verify: func() error {
					c, err := f.r.Export(f.b)
					if err != nil {
						return err
					}
					if err := virtual.CloseChunkFDs(c); err != nil {
						return err
					}
					return check(f.b, f.s, f.want)
				},
				cleanup: func() error { return errors.Join(virtual.CloseChunkFDs(chunks), f.cl.run()) },
			}, nil
		}},
		{name: "virtual Import", setup: func() (*fixture, error) {
			f, err := newVMM(fd(), 2)
			if err != nil {
				return nil, err
			}
			chunks, err := f.r.Export(f.b)
			if err != nil {
				return nil, joinSetup(err, f.cl)
			}
			f.cl.add(func() error { return virtual.CloseChunkFDs(chunks) })
			var ib *buffer.Buffer
			return &fixture{
				op: func() (err error) { ib, err = f.r.Import(chunks, f.b.Size()); return err },
				verify: func() error {
					if ib == nil {
						var err error
						if ib, err = f.r.Import(chunks, f.b.Size()); err != nil {
							return err
						}
					}
					return errors.Join(check(ib, f.s, f.want), check(f.b, f.s, f.want))
				},
				cleanup: func() error { return joinClose(closeBuf(&ib)(), f.cl) },
			}, nil
		}},
		{name: "virtual Access", setup: func() (*fixture, error) {
			f, err := newVMM(nil, 1)
			if err != nil {
				return nil, err
			}
			return &fixture{
				op:      func() error { _, err := f.r.Access(f.b, dev0()); return err },
				verify:  func() error { return check(f.b, f.s, f.want) },
				cleanup: func() error { return f.cl.run() },
			}, nil
		}},
		{name: "virtual Info", setup: func() (*fixture, error) {
			f, err := newVMM(nil, 2)
			if err != nil {
				return nil, err
			}
			return &fixture{
				op:      func() error { _, err := f.r.Info(f.b); return err },
				cleanup: func() error { return f.cl.run() },
			}, nil
		}},
		{name: "virtual SetPeerAccess", devices: 2, setup: func() (*fixture, error) {
			f, err := newVMM(nil, 2)
			if err != nil {
				return nil, err
			}
			d1, err := device(1)
			if err != nil {
				return nil, joinSetup(err, f.cl)
			}
			return &fixture{
				op: func() error { return f.r.SetPeerAccess(f.b, virtual.ReadWrite, d1) },
				verify: func() error {
					if err := f.r.SetPeerAccess(f.b, virtual.ReadWrite, d1); err != nil {
						return err
					}
					a, err := f.r.Access(f.b, d1)
					if err != nil {
						return err
					}
					if a != virtual.ReadWrite {
						return fmt.Errorf("peer access %v after SetPeerAccess(ReadWrite)", a)
					}
					return check(f.b, f.s, f.want)
				},
				cleanup: func() error { return f.cl.run() },
			}, nil
		}},
		{name: "virtual New peers", devices: 2, setup: func() (*fixture, error) {
			var cl closers
			d1, err := device(1)
			if err != nil {
				return nil, err
			}
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			var r *virtual.Resource
			return &fixture{
				op: func() (err error) {
					r, err = virtual.New(dev0(), &virtual.Options{Peers: []*cuda.Device{d1}, HandleType: virtual.HandlePosixFD})
					return err
				},
				verify: func() error {
					if r == nil {
						return nil
					}
					return usable(r, r.Granularity(), s)
				},
				cleanup: func() error { return cl.run() },
			}, nil
		}, absorbed: featuresAbsorbed},
		sleepCase(virtual.BackupToHost, false),
		sleepCase(virtual.BackupToHost, true),
		sleepCase(virtual.Discard, false),
		sleepCase(virtual.Discard, true),
	}
	sweepAll(t, cases)
}

// sleepCase sweeps Sleep (or, with wake, the Wake after an unarmed Sleep)
// of a two-chunk allocation. A failed Sleep leaves it awake with its data
// (unless the error wraps buffer.ErrPartlyFreed: then it took effect); a
// failed Wake leaves it asleep, refused with virtual.ErrAsleep, and a
// Wake with the driver healthy brings its data back (BackupToHost).
func sleepCase(backup virtual.Backup, wake bool) sweepCase {
	name := "virtual Sleep " + backup.String()
	if wake {
		name = "virtual Wake " + backup.String()
	}
	var absorbed map[string]string
	if !wake {
		absorbed = map[string]string{"cuMemUnmap": "Sleep unmaps the whole allocation in one call, then chunk by chunk if that fails"}
	}
	return sweepCase{name: name, absorbed: absorbed, setup: func() (*fixture, error) {
		f, err := newVMM(&virtual.Options{Tag: "t"}, 2)
		if err != nil {
			return nil, err
		}
		f.cl.add(f.r.DropHostBackup)
		f.cl.add(func() error { return f.r.Wake(nil) }) // runs first: awake for the Close
		so := &virtual.SleepOptions{Backup: backup}
		if wake {
			if err := f.r.Sleep(so, "t"); err != nil {
				return nil, joinSetup(err, f.cl)
			}
		}
		var opErr error
		return &fixture{
			op: func() error {
				if wake {
					opErr = f.r.Wake(nil, "t")
				} else {
					opErr = f.r.Sleep(so, "t")
				}
				return opErr
			},
			verify: func() error {
				if err := f.r.Reclaim(); err != nil {
					return fmt.Errorf("Reclaim once the driver works: %w", err)
				}
				_, rerr := f.b.ReadAt(make([]byte, 1), 0)
				asleep := errors.Is(rerr, virtual.ErrAsleep)
				took := opErr == nil || errors.Is(opErr, buffer.ErrPartlyFreed)
				switch {
				case wake && took == asleep:
					return fmt.Errorf("Wake returned %v and the memory is asleep=%v", opErr, asleep)
				case !wake && took != asleep:
					return fmt.Errorf("Sleep returned %v and the memory is asleep=%v", opErr, asleep)
				}
				if asleep {
					if err := f.r.Wake(nil, "t"); err != nil {
						return fmt.Errorf("Wake once the driver works: %w", err)
					}
				}
				if backup == virtual.Discard && (wake || took) {
					return roundTrip(f.b, f.s, 13) // contents undefined: usable is enough
				}
				return check(f.b, f.s, f.want)
			},
			cleanup: func() error { return f.cl.run() },
		}, nil
	}}
}
