//go:build cudamemfault

package faultsweep

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/faultinject"
	"github.com/cudamem/cudamem/resource"
)

// pair is two buffers (on devices da and db) from owned pools, a stream
// on device 0, and a pattern written into a. Each buffer is allocated on
// a stream of its own pool's device (pools refuse a stream of another
// device); the operations run on s.
type pair struct {
	cl       closers
	mra, mrb *resource.DevicePool
	a, b     *buffer.Buffer
	s        *cuda.Stream
	sa, sb   *cuda.Stream // allocation streams of a and b
	want     []byte
}

func newPair(size uint64, da, db int) (*pair, error) {
	p := &pair{}
	pool := func(i int) (*resource.DevicePool, error) {
		d, err := device(i)
		if err != nil {
			return nil, err
		}
		mr, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 256 << 20})
		if err != nil {
			return nil, err
		}
		p.cl.add(mr.Close)
		return mr, nil
	}
	var err error
	if p.mra, err = pool(da); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	if p.mrb, err = pool(db); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	if p.s, err = newStream(&p.cl, 0); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	// A stream of device i: s itself for device 0, else a new one.
	streamOf := func(i int) (*cuda.Stream, error) {
		if i == 0 {
			return p.s, nil
		}
		return newStream(&p.cl, i)
	}
	if p.sa, err = streamOf(da); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	if p.sb, err = streamOf(db); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	if p.a, err = p.mra.Allocate(size, p.sa); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	p.cl.add(p.a.Close)
	if p.b, err = p.mrb.Allocate(size, p.sb); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	p.cl.add(p.b.Close)
	// The allocations are ordered on sa and sb; s uses them next.
	if err := errors.Join(syncStream(p.sa), syncStream(p.sb)); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	p.want = pattern(int(size), 3)
	if err := write(p.a, p.s, 3); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	if err := buffer.CopyFromHost(p.b, make([]byte, size), p.s); err != nil {
		return nil, joinSetup(err, p.cl)
	}
	return p, joinSetup(syncStream(p.s), nil)
}

// copyCase sweeps op on a fresh pair; verify runs op again unarmed and
// checks the result with chk (both buffers must still work).
//
// verify also counts the driver calls of that run: a failure must not
// change how later operations run (one failed staged copy once turned
// staging off for the whole process), so the count must stay what it was
// on the first, clean run, within a factor of two.
func copyCase(name string, size uint64, da, db int, op func(p *pair) error, chk func(p *pair) error) sweepCase {
	want := int64(-1)
	return sweepCase{name: name, devices: max(da, db) + 1, setup: func() (*fixture, error) {
		p, err := newPair(size, da, db)
		if err != nil {
			return nil, err
		}
		return &fixture{
			op: func() error { return op(p) },
			verify: func() error {
				faultinject.Reset()
				if err := op(p); err != nil {
					return fmt.Errorf("the operation fails after the failure: %w", err)
				}
				switch got := faultinject.Calls(); {
				case want < 0:
					want = got
				case got < want/2 || got > 2*want:
					// Small differences are bookkeeping (waits on events a
					// failed copy already cleared); a collapse or a blow-up
					// means a different path (staging turned off).
					return fmt.Errorf("the operation behaves differently after the failure: %d driver calls, %d on a clean run", got, want)
				}
				if err := syncStream(p.s); err != nil {
					return err
				}
				return chk(p)
			},
			cleanup: func() error { return p.cl.run() },
		}, nil
	}}
}

// bIsA checks that b now holds a's pattern and a still does.
func bIsA(p *pair) error {
	return errors.Join(check(p.b, p.s, p.want), check(p.a, p.s, p.want))
}

func filled(w int, v uint32) func(p *pair) error {
	return func(p *pair) error {
		want := make([]byte, p.b.Size())
		for i := 0; i < len(want); i += w {
			for j := 0; j < w; j++ {
				want[i+j] = byte(v >> (8 * j))
			}
		}
		return check(p.b, p.s, want)
	}
}

// TestFaultSweepCopy: buffer↔buffer copies (same device and peer), clones,
// fills, and host↔device copies both direct and staged. staged is at
// both ways' thresholds (16 MiB out of a device): a smaller copy out is
// staged or not as its destination's pages are fresh or not (from
// 256 KiB), which would make the calls differ from run to run.
func TestFaultSweepCopy(t *testing.T) {
	const small, staged = 64 << 10, 16 << 20
	var clone *buffer.Buffer
	hostTo := func(p *pair) error { return buffer.CopyFromHost(p.b, p.want, p.s) }
	hostFrom := func(p *pair) error {
		got := make([]byte, p.a.Size())
		if err := buffer.CopyToHost(got, p.a, p.s); err != nil {
			return err
		}
		if err := syncStream(p.s); err != nil {
			return err
		}
		if !bytes.Equal(got, p.want) {
			return errors.New("CopyToHost read wrong data")
		}
		return nil
	}
	cases := []sweepCase{
		copyCase("Buffer.CopyFrom", small, 0, 0, func(p *pair) error { return p.b.CopyFrom(p.a, p.s) }, bIsA),
		copyCase("Buffer.CopyTo", small, 0, 0, func(p *pair) error { return p.a.CopyTo(p.b, p.s) }, bIsA),
		copyCase("Buffer.CopyFrom peer", small, 0, 1, func(p *pair) error { return p.b.CopyFrom(p.a, p.s) }, bIsA),
		copyCase("Buffer.CopyFrom peer reverse", small, 1, 0, func(p *pair) error { return p.b.CopyFrom(p.a, p.s) }, bIsA),
		copyCase("Buffer.Fill8", small, 0, 0, func(p *pair) error { return p.b.Fill8(0xab, p.s) }, filled(1, 0xab)),
		copyCase("Buffer.Fill16", small, 0, 0, func(p *pair) error { return p.b.Fill16(0xabcd, p.s) }, filled(2, 0xabcd)),
		copyCase("Buffer.Fill32", small, 0, 0, func(p *pair) error { return p.b.Fill32(0xdeadbeef, p.s) }, filled(4, 0xdeadbeef)),
		copyCase("CopyFromHost direct", small, 0, 0, hostTo, bIsA),
		copyCase("CopyToHost direct", small, 0, 0, hostFrom, bIsAOrUntouched),
		copyCase("CopyFromHost staged", staged, 0, 0, hostTo, bIsA),
		copyCase("CopyToHost staged", staged, 0, 0, hostFrom, bIsAOrUntouched),
		copyCase("Buffer.WriteAt", small, 0, 0, func(p *pair) error {
			_, err := p.b.WriteAt(p.want[100:], 100)
			return err
		}, func(p *pair) error {
			got := make([]byte, len(p.want)-100)
			if _, err := p.b.ReadAt(got, 100); err != nil {
				return err
			}
			if !bytes.Equal(got, p.want[100:]) {
				return errors.New("ReadAt after WriteAt read wrong data")
			}
			return nil
		}),
		copyCase("Buffer.ReadAt", small, 0, 0, func(p *pair) error {
			got := make([]byte, 1000)
			if _, err := p.a.ReadAt(got, 5); err != nil {
				return err
			}
			if !bytes.Equal(got, p.want[5:1005]) {
				return errors.New("ReadAt read wrong data")
			}
			return nil
		}, bIsAOrUntouched),
	}
	// Clone makes a buffer: the op keeps it for cleanup.
	cases = append(cases, sweepCase{name: "Buffer.Clone", setup: func() (*fixture, error) {
		p, err := newPair(small, 0, 0)
		if err != nil {
			return nil, err
		}
		clone = nil
		return &fixture{
			op: func() (err error) { clone, err = p.a.Clone(p.mra, p.s); return err },
			verify: func() error {
				c := clone
				if c == nil {
					var err error
					if c, err = p.a.Clone(p.mra, p.s); err != nil {
						return err
					}
					defer c.Close()
				}
				return check(c, p.s, p.want)
			},
			cleanup: func() error { return joinClose(closeBuf(&clone)(), p.cl) },
			state:   poolState(p.mra.Attributes),
		}, nil
	}})
	sweepAll(t, cases)
}

// bIsAOrUntouched checks only a: ReadAt does not touch b.
func bIsAOrUntouched(p *pair) error { return check(p.a, p.s, p.want) }

// TestFaultSweepManaged: prefetch and advise on managed buffers.
func TestFaultSweepManaged(t *testing.T) {
	absorbed := queryPointerAbsorbed
	mk := func(name string, op func(b *buffer.Buffer, s *cuda.Stream) error) sweepCase {
		return sweepCase{name: name, absorbed: absorbed, setup: func() (*fixture, error) {
			var cl closers
			r, err := resource.NewManaged(dev0(), nil)
			if err != nil {
				return nil, err
			}
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			b, err := r.Allocate(1<<20, s)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			cl.add(b.Close)
			if err := write(b, s, 4); err != nil {
				return nil, joinSetup(err, cl)
			}
			return &fixture{
				op: func() error { return op(b, s) },
				verify: func() error {
					if err := op(b, s); err != nil {
						return err
					}
					return check(b, s, pattern(1<<20, 4))
				},
				cleanup: func() error { return cl.run() },
			}, nil
		}}
	}
	devLoc := cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 0}
	sweepAll(t, []sweepCase{
		mk("Prefetch device", func(b *buffer.Buffer, s *cuda.Stream) error { return resource.Prefetch(b, devLoc, s) }),
		mk("Prefetch host", func(b *buffer.Buffer, s *cuda.Stream) error {
			return resource.Prefetch(b, cuda.MemLocation{Type: cuda.MemLocationTypeHost}, s)
		}),
		mk("Advise", func(b *buffer.Buffer, s *cuda.Stream) error {
			return resource.Advise(b, cuda.MemAdviseSetReadMostly, devLoc)
		}),
		mk("QueryManaged", func(b *buffer.Buffer, s *cuda.Stream) error {
			_, err := resource.QueryManaged(b)
			return err
		}),
		mk("PrefetchBatch", func(b *buffer.Buffer, s *cuda.Stream) error {
			return resource.PrefetchBatch([]*buffer.Buffer{b}, []cuda.MemLocation{devLoc}, s)
		}),
	})
	sweepAll(t, managedDiscardCases())
}

// managedDiscardCases sweeps the discards over a managed pool's buffers:
// discarded contents are indeterminate, so each check writes the buffer
// again after the discard succeeds.
func managedDiscardCases() []sweepCase {
	devLoc := cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 0}
	mk := func(name string, op func(b *buffer.Buffer, s *cuda.Stream) error) sweepCase {
		return sweepCase{name: name, absorbed: queryPointerAbsorbed, setup: func() (*fixture, error) {
			var cl closers
			p, err := resource.NewManagedPool(dev0(), nil)
			if err != nil {
				return nil, err
			}
			cl.add(p.Close)
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			b, err := p.Allocate(1<<20, s)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			cl.add(b.Close)
			return &fixture{
				op: func() error { return op(b, s) },
				verify: func() error {
					if err := op(b, s); err != nil {
						return err
					}
					if err := write(b, s, 5); err != nil {
						return err
					}
					return check(b, s, pattern(1<<20, 5))
				},
				cleanup: func() error { return cl.run() },
			}, nil
		}}
	}
	return []sweepCase{
		mk("Discard", resource.Discard),
		mk("DiscardPrefetch", func(b *buffer.Buffer, s *cuda.Stream) error { return resource.DiscardPrefetch(b, devLoc, s) }),
		mk("DiscardBatch", func(b *buffer.Buffer, s *cuda.Stream) error { return resource.DiscardBatch([]*buffer.Buffer{b}, s) }),
		mk("DiscardPrefetchBatch", func(b *buffer.Buffer, s *cuda.Stream) error {
			return resource.DiscardPrefetchBatch([]*buffer.Buffer{b}, []cuda.MemLocation{devLoc}, s)
		}),
	}
}

// poolOps is a pool resource's control surface.
type poolOps interface {
	closable
	Trim(keep uint64) error
	Attributes() (resource.PoolAttributes, error)
	SetReleaseThreshold(n uint64) error
	ResetHighWatermarks() error
}

// TestFaultSweepPoolControl: trim, attributes, thresholds, reuse flags and
// peer access of device and pinned pools.
func TestFaultSweepPoolControl(t *testing.T) {
	type mkPool func() (poolOps, error)
	devicePool := func(opts *resource.DevicePoolOptions) mkPool {
		return func() (poolOps, error) {
			if opts == nil { // the device's current pool
				return resource.CurrentDevicePool(dev0())
			}
			return resource.NewDevicePool(dev0(), opts)
		}
	}
	pinned := func() (poolOps, error) { return resource.NewPinnedPool(nil) }
	owned := &resource.DevicePoolOptions{MaxSize: 256 << 20}
	mk := func(name string, devices int, newPool mkPool, op func(p poolOps) error) sweepCase {
		return sweepCase{name: name, devices: devices, setup: func() (*fixture, error) {
			var cl closers
			p, err := newPool()
			if err != nil {
				return nil, err
			}
			cl.add(p.Close)
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			// Memory allocated and freed, so there is something to trim.
			if err := usable(p, 1<<20, s); err != nil {
				return nil, joinSetup(err, cl)
			}
			return &fixture{
				op: func() error { return op(p) },
				verify: func() error {
					if err := op(p); err != nil {
						return fmt.Errorf("the operation fails after the failure: %w", err)
					}
					return usable(p, 1<<20, s)
				},
				cleanup: func() error { return cl.run() },
				state:   poolState(p.Attributes),
			}, nil
		}}
	}
	attrs := func(p poolOps) error { _, err := p.Attributes(); return err }
	trim := func(p poolOps) error { return p.Trim(0) }
	threshold := func(p poolOps) error { return p.SetReleaseThreshold(1 << 20) }
	reset := func(p poolOps) error { return p.ResetHighWatermarks() }
	dp := func(f func(p *resource.DevicePool) error) func(p poolOps) error {
		return func(p poolOps) error { return f(p.(*resource.DevicePool)) }
	}
	dev1 := func() *cuda.Device { d, _ := device(1); return d }
	cases := []sweepCase{
		mk("DevicePool owned Trim", 1, devicePool(owned), trim),
		mk("DevicePool owned Attributes", 1, devicePool(owned), attrs),
		mk("DevicePool owned SetReleaseThreshold", 1, devicePool(owned), threshold),
		mk("DevicePool owned ResetHighWatermarks", 1, devicePool(owned), reset),
		mk("DevicePool current Trim", 1, devicePool(nil), trim),
		mk("DevicePool current Attributes", 1, devicePool(nil), attrs),
		mk("DevicePool owned SetReuseFollowEventDependencies", 1, devicePool(owned),
			dp(func(p *resource.DevicePool) error { return p.SetReuseFollowEventDependencies(false) })),
		mk("DevicePool owned SetReuseAllowOpportunistic", 1, devicePool(owned),
			dp(func(p *resource.DevicePool) error { return p.SetReuseAllowOpportunistic(false) })),
		mk("DevicePool owned SetReuseAllowInternalDependencies", 1, devicePool(owned),
			dp(func(p *resource.DevicePool) error { return p.SetReuseAllowInternalDependencies(false) })),
		mk("DevicePool owned SetPeerAccess", 2, devicePool(owned),
			dp(func(p *resource.DevicePool) error { return p.SetPeerAccess(dev1()) })),
		mk("DevicePool owned PeerAccess", 2, devicePool(owned),
			dp(func(p *resource.DevicePool) error { _, err := p.PeerAccess(); return err })),
		mk("DevicePool owned SetPeerAccess revoke", 2, devicePool(owned),
			dp(func(p *resource.DevicePool) error {
				// Grant unarmed would count calls; grant and revoke are both swept.
				if err := p.SetPeerAccess(dev1()); err != nil {
					return err
				}
				return p.SetPeerAccess()
			})),
		mk("PinnedPool Trim", 1, pinned, trim),
		mk("PinnedPool Attributes", 1, pinned, attrs),
		mk("PinnedPool SetReleaseThreshold", 1, pinned, threshold),
		mk("PinnedPool ResetHighWatermarks", 1, pinned, reset),
	}
	sweepAll(t, cases)
}
