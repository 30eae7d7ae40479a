//go:build linux

package probe

import (
	"math"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

func intp(i int) *int { return &i }

func TestResourceHostile(t *testing.T) {
	t.Cleanup(baseline(t))
	d0, d1 := dev(t, 0), dev(t, 1)
	p1, err := resource.CurrentDevicePool(d1)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	closedPool, _ := resource.CurrentDevicePool(d0)
	closedPool.Close()
	mg, _ := resource.NewManaged(d0, nil)
	mb, err := mg.Allocate(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	sd, _ := resource.NewSyncDevice(d0)
	db, _ := sd.Allocate(4096, nil)
	defer db.Close()
	cb, _ := sd.Allocate(64, nil)
	cb.Close()
	v, _ := mb.Slice(100, 10)
	cases := map[string]func() error{
		"SetDefault(d0, pool of d1)": func() error { return resource.SetDefault(d0, p1) },
		"SetDefault(d0, closed)":     func() error { return resource.SetDefault(d0, closedPool) },
		"SetDefault(nil dev)":        func() error { return resource.SetDefault(nil, p1) },
		"SetDefault(zero dev)":       func() error { return resource.SetDefault(new(cuda.Device), p1) },
		"Default(zero dev)":          func() error { _, err := resource.Default(new(cuda.Device)); return err },
		"closed pool Allocate":       func() error { _, err := closedPool.Allocate(1, nil); return err },
		"closed pool Trim":           func() error { return closedPool.Trim(0) },
		"closed pool Attributes":     func() error { _, err := closedPool.Attributes(); return err },
		"closed pool SetPeerAccess":  func() error { return closedPool.SetPeerAccess(d1) },
		"SetPeerAccess(self)":        func() error { return p1.SetPeerAccess(d1) },
		"SetPeerAccess(nil)":         func() error { return p1.SetPeerAccess(nil) },
		"SetPeerAccess(zero)":        func() error { return p1.SetPeerAccess(new(cuda.Device)) },
		"SetPeerAccess(dup)":         func() error { return p1.SetPeerAccess(d0, d0) },
		"Pool d1 alloc on d0 stream": func() error { _, err := p1.Allocate(64, d0.DefaultStream()); return err },
		"Prefetch(device mem)":       func() error { return resource.Prefetch(db, cuda.MemLocation{}, nil) },
		"Prefetch(closed)":           func() error { return resource.Prefetch(cb, cuda.MemLocation{}, nil) },
		"Prefetch(nil)":              func() error { return resource.Prefetch(nil, cuda.MemLocation{}, nil) },
		"Prefetch(bad loc)":          func() error { return resource.Prefetch(mb, cuda.MemLocation{Type: 99, ID: -5}, nil) },
		"Prefetch(loc dev 7)": func() error {
			return resource.Prefetch(mb, cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 7}, nil)
		},
		"Prefetch(view, zero strm)": func() error {
			return resource.Prefetch(v, cuda.MemLocation{Type: cuda.MemLocationTypeDevice}, new(cuda.Stream))
		},
		"Advise(bad advice)":       func() error { return resource.Advise(mb, 999, cuda.MemLocation{Type: cuda.MemLocationTypeDevice}) },
		"Advise(device mem)":       func() error { return resource.Advise(db, 1, cuda.MemLocation{Type: cuda.MemLocationTypeDevice}) },
		"Advise(borrowed garbage)": func() error { return resource.Advise(buffer.FromPointer(0xdead000, 64), 1, cuda.MemLocation{}) },
		"NewManaged(bad loc)": func() error {
			_, err := resource.NewManaged(d0, &resource.ManagedOptions{PreferredLocation: &cuda.MemLocation{Type: 42}})
			return err
		},
		"NewPinnedPool(numa -1)": func() error {
			p, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{NUMANode: intp(-1)})
			p.Close()
			return err
		},
		"NewPinnedPool(numa huge)": func() error {
			p, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{NUMANode: intp(math.MaxInt)})
			p.Close()
			return err
		},
		"NewDevicePool(reserve>max)": func() error {
			p, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{MaxSize: 1 << 20, InitialReserve: 1 << 30})
			p.Close()
			return err
		},
		"NewDevicePool(reserve huge)": func() error {
			p, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{InitialReserve: math.MaxUint64})
			p.Close()
			return err
		},
		"NewDevicePool(zero dev)": func() error { _, err := resource.NewDevicePool(new(cuda.Device), nil); return err },
		"NewSubAllocator(align 3)": func() error {
			_, err := resource.NewSubAllocator(sd, &resource.SubAllocatorOptions{Alignment: 3})
			return err
		},
		"NewSubAllocator(align 1<<63)": func() error {
			a, err := resource.NewSubAllocator(sd, &resource.SubAllocatorOptions{Alignment: 1 << 63})
			if err == nil {
				b, err := a.Allocate(1, nil)
				if err == nil {
					b.Close()
					a.Close()
					return nil
				}
				a.Close()
				return err
			}
			return err
		},
		"NewSubAllocator(initial>max)": func() error {
			a, err := resource.NewSubAllocator(sd, &resource.SubAllocatorOptions{InitialSize: 1 << 20, MaxSize: 1 << 10})
			if err == nil {
				a.Close()
			}
			return err
		},
		"NewSubAllocator(huge initial)": func() error {
			a, err := resource.NewSubAllocator(sd, &resource.SubAllocatorOptions{InitialSize: math.MaxUint64})
			if err == nil {
				a.Close()
			}
			return err
		},
		"NewSubAllocator(nil up)": func() error { _, err := resource.NewSubAllocator(nil, nil); return err },
		"SubAllocator max tiny": func() error {
			a, err := resource.NewSubAllocator(sd, &resource.SubAllocatorOptions{MaxSize: 100})
			if err != nil {
				return err
			}
			defer a.Close()
			b, err := a.Allocate(1, nil)
			if err == nil {
				b.Close()
			}
			return err
		},
	}
	for name, f := range cases {
		noPanic(t, name, func() {
			err := f()
			if err == nil {
				t.Logf("%s: accepted", name)
				return
			}
			wantErr(t, name, err, "")
			t.Logf("%s: %v", name, err)
		})
	}
	if r, _ := resource.Default(d0); r == closedPool || r == buffer.MemoryResource(p1) {
		t.Errorf("Default(d0) is now %v", r)
	}
}
