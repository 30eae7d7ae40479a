package virtual

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

const testGran = 2 << 20

// snapshot is a comparable picture of r's allocations, its leftovers and
// the driver's resources: equal snapshots mean "exactly as it was".
func snapshot(r *Resource, f *fakeDriver) string {
	r.mu.Lock()
	var as []string
	for k, a := range r.allocs {
		as = append(as, fmt.Sprintf("%#x:%+v", uint64(k), *a))
	}
	r.mu.Unlock()
	sort.Strings(as)
	r.left.mu.Lock()
	l := fmt.Sprintf("%+v", r.left.l)
	r.left.mu.Unlock()
	return strings.Join(as, "\n") + "\nleft " + l + "\n" + f.state()
}

// closeAll closes the buffers with a healthy driver and requires that
// nothing is left, in the resource or the driver.
func closeAll(t *testing.T, r *Resource, f *fakeDriver, bufs ...*buffer.Buffer) {
	t.Helper()
	f.heal()
	if err := r.Reclaim(); err != nil {
		t.Fatalf("Reclaim with a healthy driver: %v", err)
	}
	for _, b := range bufs {
		if err := b.Close(); err != nil {
			t.Fatalf("Close with a healthy driver: %v", err)
		}
	}
	if live := r.Live(); len(live) != 0 {
		t.Fatalf("allocations left: %#x", live)
	}
	f.unblock()
	f.requireEmpty(t)
}

// TestShrinkFailureLeavesAllocationIntact is the regression test for the
// half-done Shrink: the second unmap fails after the first chunk was
// already unmapped and released, and the buffer kept its old size over
// the unmapped tail. Now the shrink is undone and the buffer is whole.
func TestShrinkFailureLeavesAllocationIntact(t *testing.T) {
	r, f := newFakeResource(t, testGran, &Options{HandleType: HandleNone, Reserve: 8 * testGran})
	b, err := r.Allocate(testGran, nil)
	mustOK(t, err)
	for i := uint64(2); i <= 4; i++ {
		b, err = r.Grow(b, i*testGran)
		mustOK(t, err)
	}
	before := snapshot(r, f)
	f.failCall("cuMemUnmap", 2, false)
	nb, err := r.Shrink(b, testGran+1)
	if err == nil || nb != nil {
		t.Fatalf("Shrink with a failing unmap: buffer %v, error %v", nb, err)
	}
	if !errors.Is(err, cuda.ErrorUnknown) || !strings.Contains(err.Error(), "virtual.Shrink") {
		t.Fatalf("error %q does not carry the driver's result and the operation", err)
	}
	checkInvariants(t, r, f)
	if after := snapshot(r, f); after != before {
		t.Fatalf("a failed Shrink changed the allocation:\nbefore %s\nafter  %s", before, after)
	}
	if b.IsClosed() || b.Size() != 4*testGran {
		t.Fatalf("b after a failed Shrink: closed %v, size %d", b.IsClosed(), b.Size())
	}
	info, err := r.Info(b)
	mustOK(t, err)
	if info.Mapped != 4*testGran || info.Chunks != 4 {
		t.Fatalf("after a failed Shrink: %+v", info)
	}
	f.heal()
	b, err = r.Shrink(b, testGran+1)
	mustOK(t, err)
	checkInvariants(t, r, f)
	closeAll(t, r, f, b)
}

// TestShrinkCannotUndo: the unmaps and everything after fail, so the
// shrink cannot be undone. It then takes effect (the buffer is the new
// size, so nothing addresses the unmapped tail), says so, and what could
// not be released is kept and given back later, once.
func TestShrinkCannotUndo(t *testing.T) {
	r, f := newFakeResource(t, testGran, &Options{HandleType: HandleNone, Reserve: 8 * testGran})
	b, err := r.Allocate(4*testGran, nil)
	mustOK(t, err)
	for i := uint64(5); i <= 7; i++ {
		b, err = r.Grow(b, i*testGran)
		mustOK(t, err)
	}
	f.failCall("cuMemUnmap", 2, true)
	nb, err := r.Shrink(b, testGran)
	if err == nil || nb == nil {
		t.Fatalf("Shrink that cannot be undone: buffer %v, error %v", nb, err)
	}
	if !b.IsClosed() || nb.Size() != testGran {
		t.Fatalf("b closed %v, new size %d", b.IsClosed(), nb.Size())
	}
	checkInvariants(t, r, f)
	info, err := r.Info(nb)
	mustOK(t, err)
	if info.Size != testGran || info.Mapped < 4*testGran {
		t.Fatalf("after a forced shrink: %+v", info)
	}
	closeAll(t, r, f, nb)
}

func mustOK(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// faultCase is one operation for the fault sweeps: setup runs on a healthy
// driver and returns the buffers; op runs with faults and returns the
// buffers that live on (nil where the op failed without effect).
type faultCase struct {
	name   string
	opts   Options
	setup  func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer
	op     func(r *Resource, bufs []*buffer.Buffer) ([]*buffer.Buffer, error)
	opName string // what the error must name
}

func alloc(sizes ...uint64) func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
	return func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
		var out []*buffer.Buffer
		for _, n := range sizes {
			b, err := r.Allocate(n, nil)
			mustOK(t, err)
			out = append(out, b)
		}
		return out
	}
}

func growOp(to uint64) func(r *Resource, bufs []*buffer.Buffer) ([]*buffer.Buffer, error) {
	return func(r *Resource, bufs []*buffer.Buffer) ([]*buffer.Buffer, error) {
		nb, err := r.Grow(bufs[0], to)
		if nb == nil {
			return bufs, err
		}
		return []*buffer.Buffer{nb}, err
	}
}

func faultCases() []faultCase {
	g := uint64(testGran)
	noExport := Options{HandleType: HandleNone}
	return []faultCase{
		{name: "Allocate", opName: "virtual.Allocate", opts: noExport,
			setup: alloc(),
			op: func(r *Resource, _ []*buffer.Buffer) ([]*buffer.Buffer, error) {
				b, err := r.Allocate(3*g+1, nil)
				if b == nil {
					return nil, err
				}
				return []*buffer.Buffer{b}, err
			}},
		{name: "GrowInReservation", opName: "virtual.Grow", opts: Options{HandleType: HandleNone, Reserve: 8 * g},
			setup: alloc(2 * g), op: growOp(5 * g)},
		{name: "GrowAdjacent", opName: "virtual.Grow", opts: noExport,
			setup: alloc(2 * g), op: growOp(5 * g)},
		{name: "GrowRemap", opName: "virtual.Grow", opts: noExport,
			setup: func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
				bufs := alloc(g)(t, r, f)
				var err error
				bufs[0], err = r.Grow(bufs[0], 2*g) // two chunks to move
				mustOK(t, err)
				f.block(bufs[0].Ptr()+cuda.DevicePtr(2*g), g)
				return bufs
			}, op: growOp(5 * g)},
		{name: "Shrink", opName: "virtual.Shrink", opts: Options{HandleType: HandleNone, Reserve: 8 * g},
			setup: func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
				bufs := alloc(g)(t, r, f)
				for i := uint64(2); i <= 4; i++ {
					b, err := r.Grow(bufs[0], i*g)
					mustOK(t, err)
					bufs[0] = b
				}
				return bufs
			},
			op: func(r *Resource, bufs []*buffer.Buffer) ([]*buffer.Buffer, error) {
				nb, err := r.Shrink(bufs[0], g+1)
				if nb == nil {
					return bufs, err
				}
				return []*buffer.Buffer{nb}, err
			}},
		{name: "SetPeerAccess", opName: "virtual.SetPeerAccess", opts: Options{HandleType: HandleNone, Peers: []*cuda.Device{fakePeer1}},
			setup: func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
				bufs := alloc(g)(t, r, f)
				b, err := r.Grow(bufs[0], 3*g)
				mustOK(t, err)
				return []*buffer.Buffer{b}
			},
			op: func(r *Resource, bufs []*buffer.Buffer) ([]*buffer.Buffer, error) {
				return bufs, r.SetPeerAccess(bufs[0], ReadOnly, fakePeer1, fakePeer2)
			}},
		{name: "Close", opName: "virtual.Deallocate", opts: noExport,
			setup: func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
				bufs := alloc(g)(t, r, f)
				b, err := r.Grow(bufs[0], 3*g)
				mustOK(t, err)
				return []*buffer.Buffer{b}
			},
			op: func(r *Resource, bufs []*buffer.Buffer) ([]*buffer.Buffer, error) {
				if err := bufs[0].Close(); err != nil {
					return bufs, err
				}
				return nil, nil
			}},
	}
}

// TestFaultSweepVirtual runs every multi-step operation with its k-th
// driver call failing, for every k it makes. After each: the error carries
// the injected result and names the operation; the allocation is exactly
// as it was (or the operation took effect and says so); the driver holds
// nothing that no allocation accounts for; and with a healthy driver
// everything still works and closes to nothing.
func TestFaultSweepVirtual(t *testing.T) {
	pairs := 0
	for _, tc := range faultCases() {
		t.Run(tc.name, func(t *testing.T) {
			for k := 1; ; k++ {
				r, f := newFakeResource(t, testGran, &tc.opts)
				bufs := tc.setup(t, r, f)
				before := snapshot(r, f)
				f.failAt(k, false)
				out, err := tc.op(r, bufs)
				if f.failed == 0 {
					mustOK(t, err) // the op makes fewer than k calls: done
					if k == 1 {
						t.Fatal("the operation made no driver call")
					}
					closeAll(t, r, f, out...)
					break
				}
				pairs++
				checkInvariants(t, r, f)
				if err != nil {
					if !errors.Is(err, cuda.ErrorUnknown) || !strings.Contains(err.Error(), tc.opName) {
						t.Fatalf("call %d (%s) failing: error %q lacks the result or %s", k, f.lastFailed, err, tc.opName)
					}
					if strings.Contains(err.Error(), "half freed") {
						// Close got past the point of no return: the buffer
						// is unusable, and says so.
						if _, ierr := r.Info(out[0]); !errors.Is(ierr, cuda.ErrClosed) {
							t.Fatalf("call %d failing: half-freed buffer's Info: %v", k, ierr)
						}
					} else if sameBuffers(out, bufs) {
						if after := snapshot(r, f); after != before {
							t.Fatalf("call %d (%s) failing: the failed op changed things:\nbefore %s\nafter  %s\ncalls %v", k, f.lastFailed, before, after, f.log)
						}
					}
				}
				closeAll(t, r, f, out...)
			}
		})
	}
	t.Logf("%d (operation, failing call) pairs", pairs)
}

// TestFaultSweepVirtualSticky fails every driver call from the k-th on, so
// rollbacks fail too: nothing may be lost or freed twice, the resource
// stays consistent, and once the driver heals everything is given back.
func TestFaultSweepVirtualSticky(t *testing.T) {
	pairs := 0
	defer func() { t.Logf("%d (operation, first failing call) pairs", pairs) }()
	for _, tc := range faultCases() {
		t.Run(tc.name, func(t *testing.T) {
			for k := 1; ; k++ {
				r, f := newFakeResource(t, testGran, &tc.opts)
				bufs := tc.setup(t, r, f)
				f.failAt(k, true)
				out, err := tc.op(r, bufs)
				if f.failed == 0 {
					mustOK(t, err)
					closeAll(t, r, f, out...)
					break
				}
				pairs++
				checkInvariants(t, r, f)
				if err == nil {
					t.Fatalf("call %d on failing: no error", k)
				}
				if err != nil && !errors.Is(err, cuda.ErrorUnknown) {
					t.Fatalf("error %q lacks the driver's result", err)
				}
				closeAll(t, r, f, out...)
			}
		})
	}
}

func sameBuffers(a, b []*buffer.Buffer) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRollbackFailureIsReported: when undoing a failed step fails too, the
// error says so (joined with the first failure) and what could not be
// given back is kept, not leaked, then given back once the driver heals.
// Before, these rollback calls' errors were ignored and the resources
// leaked.
func TestRollbackFailureIsReported(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(r *Resource, f *fakeDriver) ([]*buffer.Buffer, error)
	}{
		{"Allocate", func(r *Resource, f *fakeDriver) ([]*buffer.Buffer, error) {
			f.failCall("cuMemSetAccess", 1, true)
			b, err := r.Allocate(3*testGran, nil)
			if b != nil {
				return []*buffer.Buffer{b}, err
			}
			return nil, err
		}},
		{"GrowRemap", func(r *Resource, f *fakeDriver) ([]*buffer.Buffer, error) {
			b, err := r.Allocate(2*testGran, nil)
			mustOK(t, err)
			f.block(b.Ptr()+2*testGran, testGran)
			f.failCall("cuMemCreate", 1, true)
			nb, err := r.Grow(b, 4*testGran)
			if nb != nil {
				return []*buffer.Buffer{nb}, err
			}
			return []*buffer.Buffer{b}, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, f := newFakeResource(t, testGran, nil)
			bufs, err := tc.run(r, f)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, cuda.ErrorUnknown) || !strings.Contains(err.Error(), "undoing it") || !strings.Contains(err.Error(), "kept for a retry") {
				t.Fatalf("error %q does not report the failed undo", err)
			}
			checkInvariants(t, r, f)
			r.left.mu.Lock()
			kept := !r.left.l.empty()
			r.left.mu.Unlock()
			if !kept {
				t.Fatal("nothing kept for a retry")
			}
			if err := r.Reclaim(); !errors.Is(err, cuda.ErrorUnknown) {
				t.Fatalf("Reclaim with the driver still failing: %v", err)
			}
			closeAll(t, r, f, bufs...)
		})
	}
}
