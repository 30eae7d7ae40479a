package virtual

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cudamem/cudamem/cuda"
)

// These tests count the driver calls each operation makes on the fake
// driver, against the C driver anchor's cycle
// (../shared/anchors/driver_anchor.c): issue 12 measured Allocate + Close
// of 1 GiB at 2.5 times that cycle. The counts must not grow with the
// size, and may differ from C only by explained constants. The order and
// the reservation's alignment (the granularity) are cmd/cudamem bench's C
// baseline's (testdata/cgobench, cb_vmm_allocfree), which reserves first;
// internal/suites/faultsweep's TestCallSequenceVMMAllocFree checks the same on
// the fake C driver.

// cCycle is the C anchor's VMM cycle, one call each.
var cCycle = []string{"cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cuMemAddressFree"}

// since returns the calls f made after the n-th.
func since(f *fakeDriver, n int) []string { return slices.Clone(f.log[n:]) }

func counts(calls []string) map[string]int {
	m := map[string]int{}
	for _, c := range calls {
		m[c]++
	}
	return m
}

func TestCallsAllocateCloseMatchC(t *testing.T) {
	const gran = 2 << 20
	want := []string{"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuStreamSynchronize", "cuMemUnmap", "cuMemRelease", "cuMemAddressFree"}
	for _, size := range []uint64{2 << 20, 64 << 20, 1 << 30, 16 << 30, 64<<30 + 1} {
		// Only nil streams: the fake's device is a zero Device, whose
		// explicit streams the stream resolver refuses.
		for _, s := range []*cuda.Stream{nil} {
			t.Run(fmt.Sprintf("%d", size), func(t *testing.T) {
				r, f := newFakeResource(t, gran, &Options{}) // the defaults: POSIX fd handles, as C
				n := len(f.log)
				b, err := r.Allocate(size, s)
				mustOK(t, err)
				info, err := r.Info(b)
				mustOK(t, err)
				aligned, _ := roundUp(size, r.gran)
				if info.Chunks != 1 || info.Mapped != aligned || info.Reserved != aligned {
					t.Fatalf("Allocate(%d): %+v, want one chunk of %d bytes", size, info, aligned)
				}
				mustOK(t, b.Close())
				got := since(f, n)
				if !slices.Equal(got, want) {
					t.Fatalf("Allocate + Close of %d bytes made %d calls %v, want %v", size, len(got), got, want)
				}
				// Against C: the same calls once each, plus one wait for
				// the buffer's stream before unmapping (the guarantee).
				c, g := counts(cCycle), counts(got)
				if g["cuStreamSynchronize"] != 1 {
					t.Fatalf("calls %v: want one stream wait", got)
				}
				delete(g, "cuStreamSynchronize")
				if fmt.Sprint(c) != fmt.Sprint(g) {
					t.Fatalf("calls %v differ from the C cycle %v by more than the stream wait", got, cCycle)
				}
				// The alignment the C baseline (testdata/cgobench)
				// passes: the granularity. (0, the driver's default, cost
				// 1.9x C's cycle at 1 GiB on the H200.)
				if !slices.Equal(f.aligns, []uint64{gran}) {
					t.Fatalf("cuMemAddressReserve alignments %v, want [%d] as C", f.aligns, uint64(gran))
				}
				if f.syncs != 1 {
					t.Fatalf("%d stream waits", f.syncs)
				}
				f.requireEmpty(t)
			})
		}
	}
}

// TestCallsAddrAlignPassed: an AddrAlign above the granularity is what
// the driver is asked for.
func TestCallsAddrAlignPassed(t *testing.T) {
	r, f := newFakeResource(t, testGran, &Options{HandleType: HandleNone, AddrAlign: 64 << 20})
	b, err := r.Allocate(testGran, nil)
	mustOK(t, err)
	if b.Ptr()%(64<<20) != 0 || !slices.Equal(f.aligns, []uint64{64 << 20}) {
		t.Fatalf("allocation at %#x, alignments %v", uint64(b.Ptr()), f.aligns)
	}
	closeAll(t, r, f, b)
}

// TestCallsGrowStep: a grow step is the C step (create, map, set access),
// plus the reservation of the next range when it grows past its own, and
// stays that after thousands of steps.
func TestCallsGrowStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want []string
	}{
		{"InReservation", Options{HandleType: HandleNone, Reserve: 4096 * testGran}, []string{"cuMemCreate", "cuMemMap", "cuMemSetAccess"}},
		{"Adjacent", Options{HandleType: HandleNone}, []string{"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, f := newFakeResource(t, testGran, &tc.opts)
			b, err := r.Allocate(testGran, nil)
			mustOK(t, err)
			for i := uint64(2); i <= 600; i++ {
				n := len(f.log)
				if b, err = r.Grow(b, i*testGran); err != nil {
					t.Fatal(err)
				}
				if got := since(f, n); !slices.Equal(got, tc.want) {
					t.Fatalf("grow step %d: calls %v, want %v", i, got, tc.want)
				}
			}
			checkInvariants(t, r, f)
			closeAll(t, r, f, b)
		})
	}
}

// TestCallsGrowMove: a grow that must move maps each chunk once in the new
// range, sets access on it once, waits for the stream once and unmaps the
// old range once, whatever the number of chunks (before issue 12: one
// set-access and one unmap per chunk as well).
func TestCallsGrowMove(t *testing.T) {
	for _, chunks := range []int{1, 4, 64} {
		t.Run(fmt.Sprint(chunks, " chunks"), func(t *testing.T) {
			r, f := newFakeResource(t, testGran, nil)
			b, err := r.Allocate(testGran, nil)
			mustOK(t, err)
			for i := 2; i <= chunks; i++ {
				b, err = r.Grow(b, uint64(i)*testGran)
				mustOK(t, err)
			}
			old := b.Ptr()
			f.block(old+cuda.DevicePtr(uint64(chunks)*testGran), testGran)
			n := len(f.log)
			b, err = r.Grow(b, uint64(chunks+1)*testGran)
			mustOK(t, err)
			if b.Ptr() == old {
				t.Fatal("the grow did not move")
			}
			got := counts(since(f, n))
			want := map[string]int{
				// The adjacent range (granted elsewhere, so given back),
				// then the new range.
				"cuMemAddressReserve": 2,
				"cuMemMap":            chunks + 1,
				"cuMemCreate":         1,
				"cuMemSetAccess":      1,
				"cuStreamSynchronize": 1,
				"cuMemUnmap":          1,
				// The stray range, then the old range's reservations
				// (one per chunk: each grow reserved the next range).
				"cuMemAddressFree": 1 + chunks,
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("moving %d chunks: calls %v, want %v", chunks, got, want)
			}
			checkInvariants(t, r, f)
			closeAll(t, r, f, b)
		})
	}
}

// TestCallsShrinkWaitsOnlyToUnmap: a shrink within the last chunk unmaps
// nothing, so it makes no driver call at all (it waited for the device
// before issue 12); one that drops chunks waits for the stream first.
func TestCallsShrinkWaitsOnlyToUnmap(t *testing.T) {
	r, f := newFakeResource(t, testGran, &Options{HandleType: HandleNone, Reserve: 8 * testGran})
	b, err := r.Allocate(3*testGran, nil)
	mustOK(t, err)
	n := len(f.log)
	b, err = r.Shrink(b, 3*testGran-1)
	mustOK(t, err)
	if got := since(f, n); len(got) != 0 {
		t.Fatalf("shrink within the chunk: calls %v", got)
	}
	b, err = r.Grow(b, 5*testGran)
	mustOK(t, err)
	n = len(f.log)
	b, err = r.Shrink(b, testGran)
	mustOK(t, err)
	want := []string{"cuStreamSynchronize", "cuMemUnmap", "cuMemRelease"}
	if got := since(f, n); !slices.Equal(got, want) {
		t.Fatalf("shrink dropping a chunk: calls %v, want %v", got, want)
	}
	closeAll(t, r, f, b)
}

// TestReserveOffGranule: should the driver put a range off the
// alignment it was asked for, the range is given back and Allocate fails,
// leaving nothing behind; if giving it back fails too, the range is kept
// for Reclaim.
func TestReserveOffGranule(t *testing.T) {
	r, f := newFakeResource(t, testGran, nil)
	f.offGranule = true
	b, err := r.Allocate(testGran, nil)
	if err == nil || b != nil || !errors.Is(err, cuda.ErrorUnknown) {
		t.Fatalf("Allocate on a misplaced range: %v, %v; want an error matching CUDA_ERROR_UNKNOWN", b, err)
	}
	if want := []uint64{testGran}; !slices.Equal(f.aligns, want) {
		t.Fatalf("alignments %v, want %v", f.aligns, want)
	}
	checkInvariants(t, r, f)
	f.offGranule = false
	b, err = r.Allocate(testGran, nil)
	mustOK(t, err)
	closeAll(t, r, f, b)

	r, f = newFakeResource(t, testGran, nil)
	f.offGranule = true
	f.failCall("cuMemAddressFree", 1, false)
	if _, err := r.Allocate(testGran, nil); err == nil {
		t.Fatal("Allocate on a misplaced range succeeded")
	}
	checkInvariants(t, r, f)
	if !leftoversKept(r) {
		t.Fatal("the stray range is not kept")
	}
	f.offGranule = false
	if err := r.Reclaim(); err != nil {
		t.Fatalf("Reclaim once the driver works: %v", err)
	}
	closeAll(t, r, f)
}
