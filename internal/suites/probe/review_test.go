//go:build linux

package probe

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// Found in review: primary first, then a view: the view gets the primary's value.
func TestGraphMemoryOnContextView(t *testing.T) {
	d0 := dev(t, 0)
	if _, err := resource.NewGraphMemory(d0); err != nil {
		t.Fatal(err)
	}
	c, err := d0.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v := c.Device()
	s, err := v.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	gm, _ := resource.NewGraphMemory(v)
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if b, err := gm.Allocate(64, s); err != nil {
		t.Errorf("GraphMemory(view).Allocate on a capturing stream of the view: %v", err)
	} else {
		b.Close()
	}
	if g, err := s.EndCapture(); err == nil {
		g.Close()
	}
}

// Found in review: a view first, then its context closed: the primary's value is dead for good.
func TestGraphMemoryViewFirstThenContextClosed(t *testing.T) {
	d1 := dev(t, 1)
	c, err := d1.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	resource.NewGraphMemory(c.Device())
	c.Close()
	gm, _ := resource.NewGraphMemory(d1)
	s := newStream(t, d1)
	s.BeginCapture()
	if b, err := gm.Allocate(64, s); err != nil {
		t.Errorf("GraphMemory(primary) after a view's Context.Close: %v", err)
	} else {
		b.Close()
	}
	if _, err := gm.Attributes(); err != nil {
		t.Errorf("Attributes: %v", err)
	}
	if g, err := s.EndCapture(); err == nil {
		g.Close()
	}
}

// Found in review: a Hold released while its free stream captures must not free on the legacy stream.
func TestHoldReleaseRefusedDuringCapture(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d) // non-blocking
	pool, _ := resource.NewDevicePool(d, nil)
	defer pool.Close()
	b, _ := pool.Allocate(4096, s)
	h, _ := b.Hold("test")
	if err := b.Close(); err != nil { // deferred to the last Release, on s
		t.Fatal(err)
	}
	s.BeginCapture()
	before := fake.Stat(fakecuda.Allocs)
	err := h.Release()
	if err == nil {
		t.Errorf("Release while s captures returned nil: freed on the legacy stream (allocs %d -> %d), not ordered after s", before, fake.Stat(fakecuda.Allocs))
	}
	if g, err := s.EndCapture(); err == nil {
		g.Close()
	}
	// The refused free stays the hold's: once the capture is over, a
	// second Release frees (found in the second review).
	require.NoError(t, h.Release())
	require.NoError(t, s.Sync())
	assert.Equal(t, before-1, fake.Stat(fakecuda.Allocs), "freed by the second Release")
	require.NoError(t, h.Release(), "idempotent after the free")
}

// Found in review: a wrapped blocking stream that captures must make the legacy stream refused.
func TestBorrowedBlockingStreamCaptureGuardsLegacy(t *testing.T) {
	d := dev(t, 0)
	s, _ := d.NewStreamWith(0, 0) // blocking
	defer s.Close()
	w, _ := d.WrapStream(s.Handle())
	pool, _ := resource.NewDevicePool(d, nil)
	defer pool.Close()
	if err := w.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if b, err := pool.Allocate(64, nil); err == nil { // not refused
		defer b.Close()
	} else {
		t.Logf("Allocate(nil): %v", err)
	}
	if g, err := w.EndCapture(); err != nil {
		t.Errorf("EndCapture: %v", err)
	} else {
		g.Close()
	}
}

// Found in review: graphs of a destroyed context close (they died with it).
func TestGraphCloseAfterContextClose(t *testing.T) {
	c, err := dev(t, 0).NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Device().NewStream()
	s.BeginCapture()
	g, _ := s.EndCapture()
	e, _ := g.Instantiate(0)
	c.Close()
	s.Close()
	if err := g.Close(); err != nil {
		t.Errorf("Graph.Close after Context.Close: %v (Handle still %#x)", err, g.Handle())
	}
	if err := e.Close(); err != nil {
		t.Errorf("GraphExec.Close after Context.Close: %v", err)
	}
}

// Found in review: views of a context take the batched-copy path of their GPU.
func TestBatchPathOnContextView(t *testing.T) {
	d0 := dev(t, 0)
	c, _ := d0.NewContext(0)
	defer c.Close()
	if a, b := d0.MemcpyBatchPath(), c.Device().MemcpyBatchPath(); a != b {
		t.Errorf("batch path: primary %v, view %v", a, b)
	}
}

// Found in review: Grow and Shrink of a held (exported) virtual buffer are
// refused before anything moves, and the buffer still closes.
func TestVirtualGrowShrinkRefuseHeld(t *testing.T) {
	defer baseline(t)()
	r, err := virtual.New(dev(t, 0), nil)
	require.NoError(t, err)
	g := r.Granularity()
	b, err := r.Allocate(2*g, nil)
	require.NoError(t, err)
	h, err := b.Hold("test")
	require.NoError(t, err)
	_, err = r.Shrink(b, g)
	wantErr(t, "Shrink of a held buffer", err, "Resource.Shrink")
	_, err = r.Grow(b, 4*g)
	wantErr(t, "Grow of a held buffer", err, "Resource.Grow")
	info, err := r.Info(b)
	require.NoError(t, err)
	assert.Equal(t, b.Size(), info.Size, "untouched")
	require.NoError(t, h.Release())
	require.NoError(t, b.Close())
}
