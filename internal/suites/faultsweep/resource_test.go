//go:build cudamemfault

package faultsweep

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// maker builds one kind of memory resource for the sweeps, registering its
// Close (and its upstream's) in cl; state describes its bookkeeping.
type maker struct {
	name string
	size uint64 // allocation size the sweeps use
	mk   func(cl *closers) (mr buffer.MemoryResource, state func() string, err error)
}

func dev0() *cuda.Device {
	d, _ := device(0)
	return d
}

func makers() []maker {
	pool := func(cl *closers, opts *resource.DevicePoolOptions) (*resource.DevicePool, error) {
		p, err := resource.NewDevicePool(dev0(), opts)
		if err != nil {
			return nil, err
		}
		cl.add(p.Close)
		return p, nil
	}
	owned := &resource.DevicePoolOptions{MaxSize: 256 << 20}
	return []maker{
		{"DevicePool current", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := resource.CurrentDevicePool(dev0())
			if err == nil {
				cl.add(p.Close)
			}
			if err != nil {
				return nil, nil, err
			}
			return p, poolState(p.Attributes), nil
		}},
		{"DevicePool owned", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := pool(cl, owned)
			if err != nil {
				return nil, nil, err
			}
			return p, poolState(p.Attributes), nil
		}},
		{"PinnedPool", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := resource.NewPinnedPool(nil)
			if err != nil {
				return nil, nil, err
			}
			cl.add(p.Close)
			return p, poolState(p.Attributes), nil
		}},
		{"ManagedPool current", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := resource.CurrentManagedPool(dev0())
			if err != nil {
				return nil, nil, err
			}
			cl.add(p.Close)
			return p, poolState(p.Attributes), nil
		}},
		{"ManagedPool", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := resource.NewManagedPool(dev0(), nil)
			if err != nil {
				return nil, nil, err
			}
			cl.add(p.Close)
			return p, poolState(p.Attributes), nil
		}},
		{"Managed", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			r, err := resource.NewManaged(dev0(), nil)
			return r, nil, err
		}},
		{"SyncDevice", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			r, err := resource.NewSyncDevice(dev0())
			return r, nil, err
		}},
		{"LegacyPinned", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			r, err := resource.NewLegacyPinned()
			return r, nil, err
		}},
		// The first Allocate of an empty sub-allocator grows it from the
		// upstream: this sweeps growth.
		{"SubAllocator", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			up, err := resource.NewSyncDevice(dev0())
			if err != nil {
				return nil, nil, err
			}
			a, err := resource.NewSubAllocator(up, &resource.SubAllocatorOptions{GrowSize: 1 << 20})
			if err != nil {
				return nil, nil, err
			}
			cl.add(a.Close)
			return a, func() string { return fmt.Sprintf("%+v", a.Stats()) }, nil
		}},
		{"Limiting", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := pool(cl, owned)
			if err != nil {
				return nil, nil, err
			}
			r := resource.NewLimiting(p, 1<<30)
			return r, func() string { return fmt.Sprintf("used %d", r.Used()) }, nil
		}},
		{"Statistics", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := pool(cl, owned)
			if err != nil {
				return nil, nil, err
			}
			r := resource.NewStatistics(p)
			return r, func() string {
				s := r.Stats()
				return fmt.Sprintf("current %d bytes in %d", s.CurrentBytes, s.CurrentCount)
			}, nil
		}},
		{"Tracking", 64 << 10, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := pool(cl, owned)
			if err != nil {
				return nil, nil, err
			}
			r := resource.NewTracking(p, nil)
			return r, func() string { return fmt.Sprintf("live %d bytes in %d", r.LiveBytes(), r.LiveCount()) }, nil
		}},
		{"virtual", 2 << 20, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			r, err := virtual.New(dev0(), nil)
			if err != nil {
				return nil, nil, err
			}
			return r, func() string { return fmt.Sprintf("live %d", len(r.Live())) }, nil
		}},
		// Keeping nothing free, the pool maps a block for the Allocate
		// and unmaps it at the Close: this sweeps both.
		{"virtual pool", 3 << 20, func(cl *closers) (buffer.MemoryResource, func() string, error) {
			p, err := virtual.NewPool(dev0(), &virtual.PoolOptions{Release: &resource.ReleasePolicy{}})
			if err != nil {
				return nil, nil, err
			}
			cl.add(p.Close)
			return p, func() string { return fmt.Sprintf("%+v", p.Stats()) }, nil
		}},
	}
}

// TestFaultSweepAllocate: Allocate on every resource kind.
func TestFaultSweepAllocate(t *testing.T) {
	var cases []sweepCase
	for _, m := range makers() {
		var absorbed map[string]string
		if m.name == "SubAllocator" {
			// growLocked asks for GrowSize first and, on out of memory, for
			// just the request: one failed upstream call is survived.
			// Over SyncDevice the upstream Allocate first checks the
			// stream (cuStreamQuery): its failure is the same survived
			// grow.
			absorbed = map[string]string{
				"cuMemAlloc":    "a grow out of memory retries with the bare request",
				"cuStreamQuery": "the upstream's stream check failed the grow; it retries with the bare request",
			}
		}
		cases = append(cases, sweepCase{name: m.name + " Allocate", absorbed: absorbed, setup: func() (*fixture, error) {
			var cl closers
			mr, state, err := m.mk(&cl)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			var b *buffer.Buffer
			return &fixture{
				op: func() (err error) { b, err = buffer.Allocate(mr, m.size, s); return err },
				verify: func() error {
					if b != nil {
						if err := roundTrip(b, s, 1); err != nil {
							return err
						}
					}
					return usable(mr, m.size, s)
				},
				cleanup: func() error { return joinClose(closeBuf(&b)(), cl) },
				state:   state,
			}, nil
		}})
	}
	sweepAll(t, cases)
}

// TestFaultSweepDeallocate: Buffer.Close (the resource's Deallocate) on
// every resource kind.
func TestFaultSweepDeallocate(t *testing.T) {
	var cases []sweepCase
	for _, m := range makers() {
		cases = append(cases, sweepCase{name: m.name + " Buffer.Close", setup: func() (*fixture, error) {
			var cl closers
			mr, state, err := m.mk(&cl)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			b, err := buffer.Allocate(mr, m.size, s)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			if err := write(b, s, 2); err != nil {
				return nil, joinSetup(err, cl)
			}
			_ = state
			return &fixture{
				op: b.Close,
				verify: func() error {
					if !b.IsClosed() {
						// Close failed and kept the buffer: it must still hold its data.
						if err := check(b, s, pattern(int(m.size), 2)); err != nil {
							return fmt.Errorf("buffer left open but broken: %w", err)
						}
					}
					return usable(mr, m.size, s)
				},
				cleanup: func() error { return joinClose(b.Close(), cl) },
			}, nil
		}})
	}
	sweepAll(t, cases)
}

// TestFaultSweepNewResource: creating each resource kind that calls the
// driver when made.
func TestFaultSweepNewResource(t *testing.T) {
	var cases []sweepCase
	for _, m := range makers() {
		switch m.name {
		case "Limiting", "Statistics", "Tracking", "SubAllocator":
			continue // their constructors make no driver calls beyond their upstream's (swept here already)
		}
		cases = append(cases, sweepCase{name: "New" + m.name, absorbed: featuresAbsorbed, setup: func() (*fixture, error) {
			var cl closers
			var mr buffer.MemoryResource
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			return &fixture{
				op: func() error {
					r, _, err := m.mk(&cl)
					if err == nil {
						mr = r
					}
					return err
				},
				verify: func() error {
					if mr == nil {
						return nil
					}
					return usable(mr, m.size, s)
				},
				cleanup: func() error { return cl.run() },
			}, nil
		}})
	}
	cases = append(cases,
		sweepCase{name: "NewDevicePool every option", absorbed: featuresAbsorbed, setup: func() (*fixture, error) {
			var cl closers
			var p *resource.DevicePool
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			return &fixture{
				op: func() (err error) {
					p, err = resource.NewDevicePool(dev0(), &resource.DevicePoolOptions{
						MaxSize: 64 << 20, IPC: true, ReleaseThreshold: 8 << 20, InitialReserve: 4 << 20})
					return err
				},
				verify: func() error {
					if p == nil {
						return nil
					}
					return usable(p, 1<<20, s)
				},
				cleanup: func() error {
					var err error
					if p != nil {
						err = p.Close()
					}
					return joinClose(err, cl)
				},
			}, nil
		}},
		sweepCase{name: "NewSubAllocator InitialSize", setup: func() (*fixture, error) {
			var cl closers
			var a *resource.SubAllocator
			up, err := resource.NewSyncDevice(dev0())
			if err != nil {
				return nil, err
			}
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			return &fixture{
				op: func() (err error) {
					a, err = resource.NewSubAllocator(up, &resource.SubAllocatorOptions{InitialSize: 1 << 20})
					return err
				},
				verify: func() error {
					if a == nil {
						return nil
					}
					return usable(a, 4096, s)
				},
				cleanup: func() error {
					var err error
					if a != nil {
						err = a.Close()
					}
					return joinClose(err, cl)
				},
			}, nil
		}},
	)
	sweepAll(t, cases)
}

// featuresAbsorbed: Device.Features reads the host NUMA node (the last
// attribute it reads) best-effort, as -1 when the driver cannot say; the
// resources' constructors only use it as a hint.
var featuresAbsorbed = map[string]string{"cuDeviceGetAttribute": "Device.Features reads HostNUMAID best-effort"}

// closable is a resource with Close and IsClosed.
type closable interface {
	buffer.MemoryResource
	Close() error
	IsClosed() bool
}

// TestFaultSweepCloseResource: Close of pools and of a sub-allocator that
// holds upstream memory, and SubAllocator.Trim.
func TestFaultSweepCloseResource(t *testing.T) {
	mk := func(name string, f func() (closable, error)) sweepCase {
		return sweepCase{name: name + " Close", setup: func() (*fixture, error) {
			var cl closers
			r, err := f()
			if err != nil {
				return nil, err
			}
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(joinClose(err, closers{r.Close}), cl)
			}
			// Allocate and free once so the resource holds memory to give back.
			if err := usable(r, 64<<10, s); err != nil {
				return nil, joinSetup(joinClose(err, closers{r.Close}), cl)
			}
			return &fixture{
				op: r.Close,
				verify: func() error {
					if r.IsClosed() {
						return nil
					}
					return usable(r, 64<<10, s)
				},
				cleanup: func() error { return joinClose(r.Close(), cl) },
			}, nil
		}}
	}
	cases := []sweepCase{
		mk("DevicePool current", func() (closable, error) { return resource.CurrentDevicePool(dev0()) }),
		mk("DevicePool owned", func() (closable, error) {
			return resource.NewDevicePool(dev0(), &resource.DevicePoolOptions{MaxSize: 64 << 20})
		}),
		mk("PinnedPool", func() (closable, error) { return resource.NewPinnedPool(nil) }),
		mk("SubAllocator", func() (closable, error) {
			up, err := resource.NewSyncDevice(dev0())
			if err != nil {
				return nil, err
			}
			return resource.NewSubAllocator(up, &resource.SubAllocatorOptions{InitialSize: 1 << 20})
		}),
		{name: "SubAllocator Trim", setup: func() (*fixture, error) {
			var cl closers
			up, err := resource.NewSyncDevice(dev0())
			if err != nil {
				return nil, err
			}
			a, err := resource.NewSubAllocator(up, &resource.SubAllocatorOptions{GrowSize: 1 << 20})
			if err != nil {
				return nil, err
			}
			cl.add(a.Close)
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			// Two blocks, both free after this: Trim gives both back.
			b1, err := a.Allocate(1<<20, s)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			b2, err := a.Allocate(1<<20, s)
			if err != nil {
				return nil, joinSetup(joinClose(err, closers{b1.Close}), cl)
			}
			if err := joinClose(b1.Close(), closers{b2.Close}); err != nil {
				return nil, joinSetup(err, cl)
			}
			// Trim's documented semantics (resource.TrimError): if waiting
			// for the streams fails nothing changes; after that the blocks
			// go back one by one, a block whose release fails stays, and
			// the error says exactly what was given back. So the state
			// after a failed Trim, with what its TrimError reports given
			// back added back, must equal the state before. Both blocks
			// here are entirely free, each one free range.
			var opErr error
			return &fixture{
				op:      func() error { opErr = a.Trim(); return opErr },
				verify:  func() error { return usable(a, 4096, s) },
				cleanup: func() error { return cl.run() },
				state: func() string {
					st := a.Stats()
					var te *resource.TrimError
					if errors.As(opErr, &te) {
						st.Reserved += te.Bytes
						st.Free += te.Bytes
						st.Blocks += te.Blocks
						st.FreeRanges += te.Blocks
					}
					return fmt.Sprintf("%+v", st)
				},
			}, nil
		}},
	}
	sweepAll(t, cases)
}

func joinSetup(err error, cl closers) error {
	if cerr := cl.run(); cerr != nil {
		return fmt.Errorf("%w (and undoing the setup: %v)", err, cerr)
	}
	return err
}

func joinClose(err error, cl closers) error {
	cerr := cl.run()
	switch {
	case err == nil:
		return cerr
	case cerr == nil:
		return err
	}
	return fmt.Errorf("%w; %v", err, cerr)
}
