//go:build linux

package probe

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// partlyRes hands out fake addresses; its Deallocate can be told to free
// and then fail with an error wrapping buffer.ErrPartlyFreed, as
// virtual.Resource does when the cleanup after an unmap fails.
type partlyRes struct {
	mu     sync.Mutex
	next   cuda.DevicePtr
	live   map[cuda.DevicePtr]uint64
	partly int
}

func newPartly() *partlyRes {
	return &partlyRes{next: 0x7000_0000_0000, live: map[cuda.DevicePtr]uint64{}}
}

func (m *partlyRes) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if size == 0 {
		return 0, s, nil
	}
	p := m.next
	m.next += cuda.DevicePtr(size+4095) &^ 4095
	m.live[p] = size
	return p, s, nil
}

func (m *partlyRes) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[p] != size {
		return fmt.Errorf("partlyRes: %#x not live", uint64(p))
	}
	delete(m.live, p)
	if m.partly > 0 {
		m.partly--
		return fmt.Errorf("partlyRes: %#x unmapped, cleanup failed: %w", uint64(p), buffer.ErrPartlyFreed)
	}
	return nil
}
func (m *partlyRes) DeviceAccessible() bool { return false }
func (m *partlyRes) HostAccessible() bool   { return true }
func (m *partlyRes) DeviceID() int          { return -1 }

// When the upstream's Deallocate fails with buffer.ErrPartlyFreed the
// memory is gone and the Buffer is closed; the adaptors must take it off
// their books, or Limiting loses budget for good, Statistics counts it
// current forever and Tracking reports a phantom live allocation.
func TestAdaptorsPartlyFreed(t *testing.T) {
	up := newPartly()
	lim := resource.NewLimiting(up, 1000)
	st := resource.NewStatistics(up)
	tr := resource.NewTracking(up, nil)
	for name, mr := range map[string]buffer.MemoryResource{"Limiting": lim, "Statistics": st, "Tracking": tr} {
		b, err := buffer.Allocate(mr, 600, nil)
		if err != nil {
			t.Fatal(err)
		}
		up.partly = 1
		err = b.Close()
		if !errors.Is(err, buffer.ErrPartlyFreed) {
			t.Fatalf("%s: close: %v", name, err)
		}
		if !b.IsClosed() {
			t.Fatalf("%s: buffer still open after ErrPartlyFreed", name)
		}
	}
	if lim.Used() != 0 {
		t.Errorf("Limiting.Used() = %d after the buffer's memory was freed (ErrPartlyFreed), want 0", lim.Used())
		if _, err := lim.Allocate(600, nil); err != nil {
			t.Errorf("  and the budget is gone: %v", err)
		}
	}
	if s := st.Stats(); s.CurrentBytes != 0 || s.CurrentCount != 0 {
		t.Errorf("Statistics after ErrPartlyFreed: %v, want nothing current", s)
	}
	if n := tr.LiveCount(); n != 0 {
		t.Errorf("Tracking.LiveCount() = %d after ErrPartlyFreed, want 0:\n%s", n, tr.Report())
	}
}

func TestLimitingHostile(t *testing.T) {
	up := newPartly()
	lim := resource.NewLimiting(up, 0)
	b, err := lim.Allocate(0, nil)
	if err != nil {
		t.Errorf("Limiting(0).Allocate(0): %v", err)
	} else {
		b.Close()
	}
	if _, err := lim.Allocate(1, nil); err == nil {
		t.Errorf("Limiting(0).Allocate(1): no error")
	} else {
		wantErr(t, "limit0", err, "Limiting.Allocate")
		if !errors.Is(err, cuda.ErrorOutOfMemory) {
			t.Errorf("not OOM: %v", err)
		}
	}
	lim2 := resource.NewLimiting(up, ^uint64(0))
	b1, err := lim2.Allocate(1<<40, nil)
	if err != nil {
		t.Fatal(err)
	}
	// a foreign deallocate must not let the budget go below what is live
	if err := lim2.Deallocate(0x1234000, 1<<40, nil); err == nil {
		t.Errorf("foreign deallocate: no error")
	}
	if lim2.Used() != 1<<40 {
		t.Errorf("used %d after refused foreign deallocate", lim2.Used())
	}
	b1.Close()
	tr := resource.NewTracking(up, nil)
	b2, _ := tr.Allocate(100, nil)
	if err := tr.Deallocate(b2.Ptr(), 99, nil); err == nil {
		t.Errorf("Tracking wrong size: no error")
	} else {
		wantErr(t, "tracking", err, "Tracking.Deallocate")
	}
	b2.Close()
	if err := tr.Deallocate(0x7000_0000_0000, 100, nil); err == nil {
		t.Errorf("Tracking double: no error")
	}
}
