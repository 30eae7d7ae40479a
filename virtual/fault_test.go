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
	if err := r.DropHostBackup(); err != nil {
		t.Fatalf("DropHostBackup with a healthy driver: %v", err)
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

// TestShrinkUnmapFailureKeepsChunksMapped is the regression test for the
// half-done Shrink: the second unmap fails after the first chunk was
// already unmapped and released, and the buffer kept its old size over
// the unmapped tail. Shrink owns its buffer before it unmaps anything (so
// that a Hold cannot come in between, TestShrinkRefusesHoldTakenDuring),
// so an unmap that fails takes effect too: the chunk it had unmapped is
// mapped again, every chunk stays mapped in the allocation (Info counts
// them), the new buffer has the new size, the error wraps
// buffer.ErrPartlyFreed, and a later Shrink gives the tail back.
func TestShrinkUnmapFailureKeepsChunksMapped(t *testing.T) {
	r, f := newFakeResource(t, testGran, &Options{HandleType: HandleNone, Reserve: 8 * testGran})
	b, err := r.Allocate(testGran, nil)
	mustOK(t, err)
	for i := uint64(2); i <= 4; i++ {
		b, err = r.Grow(b, i*testGran)
		mustOK(t, err)
	}
	f.failCall("cuMemUnmap", 2, false)
	nb, err := r.Shrink(b, testGran+1)
	if nb == nil || !errors.Is(err, buffer.ErrPartlyFreed) {
		t.Fatalf("Shrink with a failing unmap: buffer %v, error %v (want a new buffer and buffer.ErrPartlyFreed)", nb, err)
	}
	if !errors.Is(err, cuda.ErrorUnknown) || !strings.Contains(err.Error(), "Resource.Shrink") {
		t.Fatalf("error %q does not carry the driver's result and the operation", err)
	}
	checkInvariants(t, r, f)
	if !b.IsClosed() || nb.Size() != testGran+1 {
		t.Fatalf("after a Shrink that took effect: b closed %v, new size %d", b.IsClosed(), nb.Size())
	}
	info, err := r.Info(nb)
	mustOK(t, err)
	if info.Mapped != 4*testGran || info.Chunks != 4 {
		t.Fatalf("after a Shrink whose unmap failed: %+v (want every chunk still mapped)", info)
	}
	f.heal()
	nb, err = r.Shrink(nb, testGran)
	mustOK(t, err)
	checkInvariants(t, r, f)
	info, err = r.Info(nb)
	mustOK(t, err)
	if info.Mapped != testGran || info.Chunks != 1 {
		t.Fatalf("after the next Shrink: %+v (want the tail given back)", info)
	}
	closeAll(t, r, f, nb)
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
	if err == nil || nb == nil || !errors.Is(err, buffer.ErrPartlyFreed) {
		t.Fatalf("Shrink that cannot be undone: buffer %v, error %v (want one wrapping buffer.ErrPartlyFreed)", nb, err)
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
		{name: "Allocate", opName: "Resource.Allocate", opts: noExport,
			setup: alloc(),
			op: func(r *Resource, _ []*buffer.Buffer) ([]*buffer.Buffer, error) {
				b, err := r.Allocate(3*g+1, nil)
				if b == nil {
					return nil, err
				}
				return []*buffer.Buffer{b}, err
			}},
		{name: "GrowInReservation", opName: "Resource.Grow", opts: Options{HandleType: HandleNone, Reserve: 8 * g},
			setup: alloc(2 * g), op: growOp(5 * g)},
		{name: "GrowAdjacent", opName: "Resource.Grow", opts: noExport,
			setup: alloc(2 * g), op: growOp(5 * g)},
		{name: "GrowRemap", opName: "Resource.Grow", opts: noExport,
			setup: func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
				bufs := alloc(g)(t, r, f)
				var err error
				bufs[0], err = r.Grow(bufs[0], 2*g) // two chunks to move
				mustOK(t, err)
				f.block(bufs[0].Ptr()+cuda.DevicePtr(2*g), g)
				return bufs
			}, op: growOp(5 * g)},
		{name: "Shrink", opName: "Resource.Shrink", opts: Options{HandleType: HandleNone, Reserve: 8 * g},
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
		{name: "SetPeerAccess", opName: "Resource.SetPeerAccess", opts: Options{HandleType: HandleNone, Peers: []*cuda.Device{fakePeer1}},
			setup: func(t *testing.T, r *Resource, f *fakeDriver) []*buffer.Buffer {
				bufs := alloc(g)(t, r, f)
				b, err := r.Grow(bufs[0], 3*g)
				mustOK(t, err)
				return []*buffer.Buffer{b}
			},
			op: func(r *Resource, bufs []*buffer.Buffer) ([]*buffer.Buffer, error) {
				return bufs, r.SetPeerAccess(bufs[0], ReadOnly, fakePeer1, fakePeer2)
			}},
		{name: "Close", opName: "Resource.Deallocate", opts: noExport,
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
					if errors.Is(err, buffer.ErrPartlyFreed) {
						requireTookEffect(t, fmt.Sprintf("call %d (%s) failing", k, f.lastFailed), r, f, bufs, out)
					} else {
						// Any other error: the op did not happen.
						if !sameBuffers(out, bufs) {
							t.Fatalf("call %d (%s) failing: new buffers %v with an error not wrapping buffer.ErrPartlyFreed: %v", k, f.lastFailed, out, err)
						}
						if after := snapshot(r, f); after != before {
							t.Fatalf("call %d (%s) failing: the failed op changed things:\nbefore %s\nafter  %s\ncalls %v", k, f.lastFailed, before, after, f.log)
						}
						for _, b := range bufs {
							if b.IsClosed() {
								t.Fatalf("call %d (%s) failing: the op did not happen (%v) but closed %v", k, f.lastFailed, err, b)
							}
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
				if !errors.Is(err, cuda.ErrorUnknown) {
					t.Fatalf("error %q lacks the driver's result", err)
				}
				if errors.Is(err, buffer.ErrPartlyFreed) {
					requireTookEffect(t, fmt.Sprintf("calls from %d on failing", k), r, f, bufs, out)
				} else {
					if !sameBuffers(out, bufs) {
						t.Fatalf("calls from %d on failing: new buffers %v with an error not wrapping buffer.ErrPartlyFreed: %v", k, out, err)
					}
					for _, b := range bufs {
						if b.IsClosed() {
							t.Fatalf("calls from %d on failing: the op did not happen (%v) but closed %v", k, err, b)
						}
					}
				}
				closeAll(t, r, f, out...)
			}
		})
	}
}

// requireTookEffect checks an operation that returned an error wrapping
// buffer.ErrPartlyFreed ("done, but not tidy"): the buffers it was given
// are closed (consumed, or freed by Close), nothing can reach memory that
// is gone, what was not given back is kept as leftovers (not leaked: see
// checkInvariants), and with the driver healed Reclaim gives it all back.
func requireTookEffect(t *testing.T, what string, r *Resource, f *fakeDriver, in, out []*buffer.Buffer) {
	t.Helper()
	for _, b := range in {
		if !b.IsClosed() {
			t.Fatalf("%s: the op took effect but left its input %v open", what, b)
		}
		if _, err := r.Info(b); !errors.Is(err, cuda.ErrClosed) {
			t.Fatalf("%s: Info of the consumed buffer: %v, want ErrClosed", what, err)
		}
	}
	overMapped := false // a Shrink may keep chunks it could not unmap
	for _, b := range out {
		if b.IsClosed() {
			continue // Close: the buffer is the input, closed
		}
		info, err := r.Info(b)
		if err != nil {
			t.Fatalf("%s: the buffer returned with ErrPartlyFreed: %v", what, err)
		}
		need, _ := roundUp(b.Size(), r.gran)
		if info.Size != b.Size() || info.Mapped < need {
			t.Fatalf("%s: buffer of %d bytes over %+v", what, b.Size(), info)
		}
		overMapped = overMapped || info.Mapped > need
	}
	r.left.mu.Lock()
	kept := !r.left.l.empty()
	r.left.mu.Unlock()
	if !kept && !overMapped {
		// The error said something was not given back: it must be held.
		t.Fatalf("%s: ErrPartlyFreed, but nothing kept for Reclaim", what)
	}
	healed := f.fail == 0 || (!f.sticky && f.calls >= f.fail)
	if healed {
		if err := r.Reclaim(); err != nil {
			t.Fatalf("%s: Reclaim after the fault passed: %v", what, err)
		}
		r.left.mu.Lock()
		kept = !r.left.l.empty()
		r.left.mu.Unlock()
		if kept {
			t.Fatalf("%s: Reclaim returned nil but kept leftovers", what)
		}
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

// leftoversKept reports whether r holds leftovers for a retry.
func leftoversKept(r *Resource) bool {
	r.left.mu.Lock()
	defer r.left.mu.Unlock()
	return !r.left.l.empty()
}

// requirePartlyFreed fails t unless err reports a done-but-untidy
// operation: it wraps buffer.ErrPartlyFreed and the injected result, and
// names the operation and the driver call that failed.
func requirePartlyFreed(t *testing.T, err error, op, call string) {
	t.Helper()
	if !errors.Is(err, buffer.ErrPartlyFreed) || !errors.Is(err, cuda.ErrorUnknown) ||
		!strings.Contains(err.Error(), op) || !strings.Contains(err.Error(), call) {
		t.Fatalf("error %v: want one wrapping buffer.ErrPartlyFreed and %v, naming %s and %s", err, cuda.ErrorUnknown, op, call)
	}
}

// reclaimAfterHealing checks that what a done-but-untidy operation kept is
// still held while the driver fails, and is all given back once it heals.
func reclaimAfterHealing(t *testing.T, r *Resource, f *fakeDriver, call string) {
	t.Helper()
	checkInvariants(t, r, f)
	if !leftoversKept(r) {
		t.Fatal("nothing kept for a retry")
	}
	f.failCall(call, 1, true)
	if err := r.Reclaim(); !errors.Is(err, cuda.ErrorUnknown) || !strings.Contains(err.Error(), "Resource.Reclaim") {
		t.Fatalf("Reclaim with %s still failing: %v", call, err)
	}
	checkInvariants(t, r, f)
	f.heal()
	if err := r.Reclaim(); err != nil {
		t.Fatalf("Reclaim with a healed driver: %v", err)
	}
	if leftoversKept(r) {
		t.Fatal("Reclaim returned nil but kept leftovers")
	}
	checkInvariants(t, r, f)
}

// TestClosePastUnmapClosesBuffer is the regression test for the sweep's
// "virtual Buffer.Close k=3/4": the release of the chunk (or the freeing
// of the address space) failed after the chunk was unmapped, and the
// buffer stayed open over unmapped memory (on a GPU, reading it was an
// illegal address that poisons the context). Now the Close finishes: the
// buffer is closed, the error wraps buffer.ErrPartlyFreed, and what the
// driver refused is kept and given back by Reclaim.
func TestClosePastUnmapClosesBuffer(t *testing.T) {
	for _, call := range []string{"cuMemRelease", "cuMemAddressFree"} {
		t.Run(call, func(t *testing.T) {
			r, f := newFakeResource(t, testGran, nil)
			b, err := r.Allocate(testGran, nil)
			mustOK(t, err)
			f.failCall(call, 1, false)
			err = b.Close()
			requirePartlyFreed(t, err, "Resource.Deallocate", call)
			if !b.IsClosed() {
				t.Fatal("buffer left open over unmapped memory")
			}
			if err := b.Fill32(1, nil); !errors.Is(err, cuda.ErrClosed) {
				t.Fatalf("Fill32 after a Close that took effect: %v, want ErrClosed", err)
			}
			if _, err := r.Info(b); !errors.Is(err, cuda.ErrClosed) {
				t.Fatalf("Info after a Close that took effect: %v, want ErrClosed", err)
			}
			if live := r.Live(); len(live) != 0 {
				t.Fatalf("allocation still filed: %#x", live)
			}
			if err := b.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			reclaimAfterHealing(t, r, f, call)
			f.requireEmpty(t)
		})
	}
}

// TestCloseBeforeUnmapKeepsBuffer: a Close whose first unmap fails has
// given nothing back, so it must not claim ErrPartlyFreed: the buffer
// stays open and whole, and a retried Close frees everything.
func TestCloseBeforeUnmapKeepsBuffer(t *testing.T) {
	r, f := newFakeResource(t, testGran, nil)
	b, err := r.Allocate(testGran, nil)
	mustOK(t, err)
	before := snapshot(r, f)
	f.failCall("cuMemUnmap", 1, false)
	err = b.Close()
	if err == nil || errors.Is(err, buffer.ErrPartlyFreed) || !errors.Is(err, cuda.ErrorUnknown) {
		t.Fatalf("Close with the unmap failing: %v", err)
	}
	if b.IsClosed() {
		t.Fatal("buffer closed though nothing was freed")
	}
	if after := snapshot(r, f); after != before {
		t.Fatalf("failed Close changed things:\nbefore %s\nafter  %s", before, after)
	}
	closeAll(t, r, f, b)
}

// TestShrinkReleaseFailureReturnsNewBuffer is the regression test for the
// sweep's "virtual Shrink k=4/5": the shrink took effect but releasing a
// chunk past the new size failed. Shrink returns the new buffer with an
// error that wraps buffer.ErrPartlyFreed (before, the error did not say
// the shrink was done, so callers dropped the new buffer and leaked it).
func TestShrinkReleaseFailureReturnsNewBuffer(t *testing.T) {
	for nth := 1; nth <= 2; nth++ {
		t.Run(fmt.Sprint("release ", nth), func(t *testing.T) {
			r, f := newFakeResource(t, testGran, nil)
			b, err := r.Allocate(testGran, nil)
			mustOK(t, err)
			for i := uint64(2); i <= 3; i++ {
				b, err = r.Grow(b, i*testGran)
				mustOK(t, err)
			}
			f.failCall("cuMemRelease", nth, false)
			nb, err := r.Shrink(b, testGran)
			requirePartlyFreed(t, err, "Resource.Shrink", "cuMemRelease")
			if nb == nil || nb == b || !b.IsClosed() || nb.Size() != testGran {
				t.Fatalf("Shrink that took effect: new buffer %v, old closed %v", nb, b.IsClosed())
			}
			info, err := r.Info(nb)
			mustOK(t, err)
			if info.Mapped != testGran || info.Chunks != 1 {
				t.Fatalf("after the shrink: %+v", info)
			}
			reclaimAfterHealing(t, r, f, "cuMemRelease")
			closeAll(t, r, f, nb)
		})
	}
}

// TestGrowRemapCleanupFailure is the regression test for the sweep's
// "virtual Grow remap" k=2 and k=12..15 (of the sweep then). The allocation
// (two chunks in two reservations) cannot grow in place, so Grow moves it;
// giving back what is no longer needed then fails: the range the driver
// granted at the wrong address (k=2: before, that failure was swallowed),
// or the old range's mappings or address space (k=12..15: before, the
// error did not say the grow was done, so callers dropped the new buffer).
// The old range's mappings now go in one cuMemUnmap, so there is one
// unmap to fail, not one per chunk. Grow returns
// the new buffer with an error wrapping buffer.ErrPartlyFreed, the data's
// memory is the same, and Reclaim gives the rest back.
func TestGrowRemapCleanupFailure(t *testing.T) {
	for _, tc := range []struct {
		call string
		nth  int
	}{
		{"cuMemAddressFree", 1}, // the stray range (sweep k=2)
		{"cuMemUnmap", 1},       // the old range's mappings, in one call
		{"cuMemAddressFree", 2}, // the old range's reservations (k=14, 15)
		{"cuMemAddressFree", 3},
	} {
		t.Run(fmt.Sprint(tc.call, " ", tc.nth), func(t *testing.T) {
			r, f := newFakeResource(t, testGran, nil)
			b, err := r.Allocate(testGran, nil)
			mustOK(t, err)
			b, err = r.Grow(b, 2*testGran) // adjacent: two reservations
			mustOK(t, err)
			info, err := r.Info(b)
			mustOK(t, err)
			if info.Chunks != 2 || info.Reserved != 2*testGran {
				t.Fatalf("setup: %+v", info)
			}
			old := b.Ptr()
			f.block(old+2*testGran, testGran)
			r.mu.Lock()
			handles := append([]chunk(nil), r.allocs[old].chunks...)
			r.mu.Unlock()
			f.failCall(tc.call, tc.nth, false)
			nb, err := r.Grow(b, 4*testGran)
			requirePartlyFreed(t, err, "Resource.Grow", tc.call)
			if nb == nil || !b.IsClosed() || nb.Size() != 4*testGran || nb.Ptr() == old {
				t.Fatalf("Grow that took effect: new buffer %v, old closed %v", nb, b.IsClosed())
			}
			// Nothing copied: the same physical chunks, now at the new base.
			r.mu.Lock()
			a := r.allocs[nb.Ptr()]
			var same bool
			if a != nil && len(a.chunks) == 3 {
				same = a.chunks[0].h == handles[0].h && a.chunks[1].h == handles[1].h
			}
			r.mu.Unlock()
			if !same {
				t.Fatal("the moved allocation does not hold the old chunks first")
			}
			reclaimAfterHealing(t, r, f, tc.call)
			closeAll(t, r, f, nb)
		})
	}
}
