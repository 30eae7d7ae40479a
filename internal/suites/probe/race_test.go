//go:build linux

package probe

import (
	"errors"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

func okOrClosed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("%s: %v", what, err)
	}
}

func TestRaceBufferCloseVsUse(t *testing.T) {
	check := baseline(t)
	d0 := dev(t, 0)
	mr, _ := resource.Default(d0)
	other, _ := buffer.Allocate(mr, 256, nil)
	defer other.Close()
	for i := 0; i < 50; i++ {
		b, err := buffer.Allocate(mr, 256, nil)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for j := 0; j < 20; j++ {
					switch (g + j) % 7 {
					case 0:
						okOrClosed(t, "fill", b.Fill32(1, nil))
					case 1:
						okOrClosed(t, "copyfrom", b.CopyFrom(other, nil))
					case 2:
						okOrClosed(t, "copyto", other.CopyTo(b, nil))
					case 3:
						v, err := b.Slice(8, 64)
						okOrClosed(t, "slice", err)
						if err == nil {
							okOrClosed(t, "view fill", v.Fill8(2, nil))
							v.Close()
						}
					case 4:
						_, err := b.ReadAt(make([]byte, 32), 100)
						okOrClosed(t, "readat", err)
					case 5:
						okOrClosed(t, "tohost", buffer.CopyToHost(make([]uint32, 64), b, nil))
					case 6:
						c, err := b.Clone(nil, nil)
						okOrClosed(t, "clone", err)
						if err == nil {
							c.Close()
						}
					}
				}
			}(g)
		}
		wg.Add(1)
		go func() { defer wg.Done(); okOrClosed(t, "close", b.Close()) }()
		wg.Wait()
		b.Close()
	}
	other.Close()
	check()
}

func TestRacePoolCloseVsAllocate(t *testing.T) {
	check := baseline(t)
	d0 := dev(t, 0)
	for i := 0; i < 20; i++ {
		p, err := resource.CurrentDevicePool(d0)
		if err != nil {
			t.Fatal(err)
		}
		sa, err := resource.NewSubAllocator(p, &resource.SubAllocatorOptions{GrowSize: 1 << 16})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var bufs []*buffer.Buffer
		var wg sync.WaitGroup
		for g := 0; g < 6; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for j := 0; j < 20; j++ {
					var mr buffer.MemoryResource = p
					if g%2 == 0 {
						mr = sa
					}
					b, err := buffer.Allocate(mr, uint64(1+j*97), nil)
					okOrClosed(t, "alloc", err)
					if err != nil {
						continue
					}
					if j%2 == 0 {
						okOrClosed(t, "close buf", b.Close())
					} else {
						mu.Lock()
						bufs = append(bufs, b)
						mu.Unlock()
					}
				}
			}(g)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			// Buffers still live: documented as ErrorIllegalState.
			if err := sa.Close(); err != nil && !errors.Is(err, cuda.ErrorIllegalState) {
				t.Errorf("sa close: %v", err)
			}
		}()
		go func() { defer wg.Done(); _ = sa.Trim() }()
		wg.Wait()
		for _, b := range bufs {
			if err := b.Close(); err != nil {
				t.Errorf("closing a buffer after its allocator closed: %v", err)
			}
		}
		if err := sa.Close(); err != nil {
			t.Errorf("sa close after its buffers: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("pool close: %v", err)
		}
	}
	check()
}
