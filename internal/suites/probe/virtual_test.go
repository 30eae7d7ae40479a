//go:build linux

package probe

import (
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/virtual"
)

func newVirtual(t *testing.T, opts *virtual.Options) *virtual.Resource {
	t.Helper()
	r, err := virtual.New(dev(t, 0), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestVirtualGrowShrinkHostile(t *testing.T) {
	check := baseline(t)
	r := newVirtual(t, nil)
	g := r.Granularity()
	b, err := r.Allocate(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := buffer.CopyFromHost(b, make([]byte, g), nil), error(nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{math.MaxUint64, math.MaxUint64 - g + 2, 1 << 63, 1 << 62} {
		noPanic(t, "grow huge", func() {
			nb, err := r.Grow(b, n)
			if err == nil {
				t.Errorf("Grow(%d): no error", n)
				b = nb
				return
			}
			if nb != nil {
				t.Errorf("Grow(%d): buffer with error %v", n, err)
				b = nb
			}
			wantErr(t, "grow huge", err, "Resource.Grow")
		})
	}
	if b.IsClosed() {
		t.Fatal("b closed by a failed grow")
	}
	same, err := r.Grow(b, b.Size())
	if err != nil || same != b {
		t.Errorf("Grow same size: %v %v", same, err)
	}
	same, err = r.Shrink(b, b.Size())
	if err != nil || same != b {
		t.Errorf("Shrink same size: %v %v", same, err)
	}
	if nb, err := r.Shrink(b, 0); err == nil {
		t.Errorf("Shrink to 0: no error")
		b = nb
	} else {
		wantErr(t, "shrink0", err, "Resource.Shrink")
	}
	// a view, a borrowed buffer, a buffer of another resource
	v, _ := b.Slice(0, 16)
	if _, err := r.Grow(v, 2*g); err == nil {
		t.Errorf("Grow(view): no error")
	}
	if _, err := r.Grow(buffer.FromPointer(b.Ptr(), b.Size()), 2*g); err == nil {
		t.Errorf("Grow(borrowed): no error")
	}
	r2 := newVirtual(t, nil)
	if _, err := r2.Grow(b, 2*g); err == nil {
		t.Errorf("Grow through another resource: no error")
	}
	if err := r2.Deallocate(b.Ptr(), b.Size(), nil); err == nil {
		t.Errorf("Deallocate through another resource: no error")
	}
	if err := r.Deallocate(b.Ptr()+cuda.DevicePtr(g), g, nil); err == nil {
		t.Errorf("Deallocate foreign pointer: no error")
	}
	if err := r.Deallocate(b.Ptr(), g+1, nil); err == nil {
		t.Errorf("Deallocate wrong size: no error")
	}
	nb, err := r.Grow(b, 3*g+1)
	if err != nil {
		t.Fatal(err)
	}
	if !b.IsClosed() {
		t.Errorf("old buffer open after Grow")
	}
	if _, err := r.Grow(b, 5*g); err == nil {
		t.Errorf("Grow(consumed): no error")
	}
	nb2, err := r.Shrink(nb, 1)
	if err != nil {
		t.Fatal(err)
	}
	if nb2.Size() != 1 {
		t.Errorf("size %d", nb2.Size())
	}
	closeAll(t, nb2)
	if _, err := r.Grow(nb2, 2*g); err == nil {
		t.Errorf("Grow(closed): no error")
	} else if !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("Grow(closed): %v", err)
	}
	z, err := r.Allocate(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if nz, err := r.Grow(z, g); err != nil {
		t.Logf("Grow(empty): %v", err)
	} else {
		t.Logf("Grow(empty) ok")
		z = nz
	}
	closeAll(t, z)
	if err := r.Reclaim(); err != nil {
		t.Error(err)
	}
	if live := r.Live(); len(live) != 0 {
		t.Errorf("live %v", live)
	}
	check()
}

func TestVirtualGrowVsClose(t *testing.T) {
	check := baseline(t)
	r := newVirtual(t, nil)
	g := r.Granularity()
	for i := 0; i < 200; i++ {
		b, err := r.Allocate(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var nb *buffer.Buffer
		var gerr, cerr error
		wg.Add(2)
		go func() { defer wg.Done(); nb, gerr = r.Grow(b, 2*g+uint64(i%3)*g) }()
		go func() { defer wg.Done(); cerr = b.Close() }()
		wg.Wait()
		if nb != nil {
			if err := nb.Close(); err != nil {
				t.Errorf("iteration %d: close grown: %v", i, err)
			}
		}
		if !b.IsClosed() {
			t.Errorf("iteration %d: b still open (grow %v, close %v)", i, gerr, cerr)
			b.Close()
		}
	}
	if err := r.Reclaim(); err != nil {
		t.Error(err)
	}
	if live := r.Live(); len(live) != 0 {
		t.Errorf("live allocations left: %d", len(live))
	}
	check()
}

func TestVirtualOptionsHostile(t *testing.T) {
	d0 := dev(t, 0)
	for _, o := range []virtual.Options{
		{AllocationType: 7}, {AllocationType: -1}, {Location: 99}, {HandleType: 42}, {Granularity: 3},
		{SelfAccess: 9}, {PeerAccess: -3}, {NUMANode: -1, Location: virtual.OnHostNUMA}, {NUMANode: 5},
		{AddrAlign: 3}, {AddrAlign: 1 << 63}, {Reserve: math.MaxUint64}, {AddrHint: math.MaxUint64},
		{Peers: []*cuda.Device{nil}}, {Peers: []*cuda.Device{new(cuda.Device)}}, {Peers: []*cuda.Device{d0}},
		{SelfAccess: virtual.NoAccess},
	} {
		noPanic(t, "options", func() {
			r, err := virtual.New(d0, &o)
			if err == nil {
				t.Logf("virtual.New(%+v): accepted", o)
				b, err := r.Allocate(1, nil)
				if err == nil {
					b.Close()
				} else {
					t.Logf("   Allocate: %v", err)
				}
				return
			}
			wantErr(t, "options", err, "virtual.New")
		})
	}
	if _, err := virtual.New(new(cuda.Device), nil); err == nil {
		t.Errorf("New(zero device): no error")
	}
	if _, err := virtual.New(nil, nil); err == nil {
		t.Errorf("New(nil): no error")
	}
}

func TestVirtualImportHostile(t *testing.T) {
	check := baseline(t)
	r := newVirtual(t, &virtual.Options{HandleType: virtual.HandlePosixFD})
	g := r.Granularity()
	b, err := r.Allocate(2*g, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := r.Export(b)
	if err != nil {
		t.Fatal(err)
	}
	before := len(testutil.FDs(t))
	for name, c := range map[string][]virtual.Chunk{
		"nil":      nil,
		"neg fd":   {{FD: -1, Size: g}},
		"zero":     {{FD: chunks[0].FD, Size: 0}},
		"odd":      {{FD: chunks[0].FD, Size: g + 1}},
		"huge":     {{FD: chunks[0].FD, Size: 1 << 63}, {FD: chunks[0].FD, Size: 1 << 63}},
		"wrong fd": {{FD: 0, Size: g}},
		"not fd":   {{FD: 1 << 20, Size: g}},
		"too big":  {{FD: chunks[0].FD, Size: 4 * g}},
	} {
		for _, size := range []uint64{0, 1, g, 1 << 63, math.MaxUint64} {
			noPanic(t, name, func() {
				nb, err := r.Import(c, size)
				if err == nil {
					t.Errorf("Import(%s, %d): accepted", name, size)
					nb.Close()
					return
				}
				wantErr(t, name, err, "virtual.Import")
			})
		}
	}
	if got := len(testutil.FDs(t)); got != before {
		t.Errorf("fds %d, before %d", got, before)
	}
	if err := virtual.CloseChunkFDs(chunks); err != nil {
		t.Error(err)
	}
	closeAll(t, b)
	check()
}
