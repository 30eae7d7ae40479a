package timeline

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// heap is a fake upstream: first-fit addresses in a large made-up range,
// so that freed addresses are handed out again (as a pool does).
type heap struct {
	mu   sync.Mutex
	live map[cuda.DevicePtr]uint64
	dev  int
}

func newHeap() *heap { return &heap{live: map[cuda.DevicePtr]uint64{}} }

func (h *heap) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if size == 0 {
		return 0, s, nil
	}
	need := (size + 255) &^ 255
	type r struct{ a, n uint64 }
	var used []r
	for p, n := range h.live {
		used = append(used, r{uint64(p), (n + 255) &^ 255})
	}
	slices.SortFunc(used, func(x, y r) int { return cmp.Compare(x.a, y.a) })
	at := uint64(0x7f0000000000)
	for _, u := range used {
		if u.a >= at+need {
			break
		}
		at = max(at, u.a+u.n)
	}
	h.live[cuda.DevicePtr(at)] = size
	return cuda.DevicePtr(at), s, nil
}

func (h *heap) Deallocate(p cuda.DevicePtr, size uint64, _ *cuda.Stream) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.live[p] != size {
		return cuda.Errorf("heap.Deallocate", cuda.ErrInvalidArgument, "%#x (%d bytes) not live", uint64(p), size)
	}
	delete(h.live, p)
	return nil
}
func (h *heap) DeviceAccessible() bool { return true }
func (h *heap) HostAccessible() bool   { return false }
func (h *heap) DeviceID() int          { return h.dev }

// run makes n random allocations and frees through mr (about half the
// time a free, at most 40 live), calling after(stats) after each; it
// frees everything at the end.
func run(t *testing.T, mr buffer.MemoryResource, n int, seed uint64, after func()) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	var held []*buffer.Buffer
	for range n {
		if len(held) > 0 && (len(held) >= 40 || rng.IntN(2) == 0) {
			i := rng.IntN(len(held))
			require.NoError(t, held[i].Close())
			held = slices.Delete(held, i, i+1)
		} else {
			b, err := buffer.Allocate(mr, 1+rng.Uint64N(1<<16), nil)
			require.NoError(t, err)
			held = append(held, b)
		}
		after()
	}
	for _, b := range held {
		require.NoError(t, b.Close())
		after()
	}
}

// bottomAt is band b's bottom at step k.
func bottomAt(b band, k int) uint64 {
	v := b.points[0].bottom
	for _, p := range b.points {
		if p.step > k {
			break
		}
		v = p.bottom
	}
	return v
}

// checkPanel asserts that at every step the live bands tile [0, usage)
// with no gap and no overlap, and that usage is want[k].
func checkPanel(t *testing.T, p panel, want []uint64) {
	t.Helper()
	require.Equal(t, want, p.usage, "panel %s: bytes in use at each step", p.resource)
	for k := range p.usage {
		type iv struct{ lo, hi uint64 }
		var ivs []iv
		for _, b := range p.bands {
			if b.start > k || b.end <= k {
				continue
			}
			if b.alloc < 0 {
				var pt point
				for _, q := range b.points {
					if q.step <= k {
						pt = q
					}
				}
				ivs = append(ivs, iv{pt.bottom, pt.bottom + pt.height})
				continue
			}
			lo := bottomAt(b, k)
			ivs = append(ivs, iv{lo, lo + b.size})
		}
		slices.SortFunc(ivs, func(a, b iv) int { return cmp.Compare(a.lo, b.lo) })
		var at uint64
		for _, v := range ivs {
			require.Equal(t, at, v.lo, "step %d: bands must stack without gaps or overlaps", k)
			at = v.hi
		}
		require.Equal(t, p.usage[k], at, "step %d: the stack's height is the bytes in use", k)
	}
}

// TestLayoutMatchesStatistics: a Statistics over a Recorder, random
// allocations and frees; after every step the trace's usage, and the
// height of the stacked bands, equal what Statistics reports.
func TestLayoutMatchesStatistics(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int
		maxBands int
	}{
		{"all", 0, 500},
		{"aggregated", 0, 7},
		{"dropped", 100, 500},
		{"dropped+aggregated", 64, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := NewLog(tc.capacity)
			rec := NewRecorder(newHeap(), log, &RecorderOptions{Name: "heap"})
			stats := resource.NewStatistics(rec)
			want := []uint64{0}
			run(t, stats, 400, 1, func() { want = append(want, stats.Stats().CurrentBytes) })
			tr := log.Trace()
			if tc.capacity > 0 {
				require.Equal(t, uint64(len(want)-1-tc.capacity), tr.Dropped)
				require.Len(t, tr.Events, tc.capacity)
				// The window starts after the dropped events.
				want = want[len(want)-1-tc.capacity:]
			}
			usage := tr.Usage("heap")
			require.Len(t, usage, len(want))
			for k, u := range usage {
				require.Equal(t, want[k], u.Bytes, "step %d", k)
			}
			assert.Equal(t, usage, tr.TotalUsage(), "one resource: the same")
			allocs := tr.Allocations()
			if tc.capacity > 0 {
				require.NotEmpty(t, tr.Before, "allocations from before the window")
			}
			p := layoutPanel(tr, allocs, "heap", tc.maxBands)
			checkPanel(t, p, want)
			if len(allocs) > tc.maxBands {
				assert.Equal(t, len(allocs)-tc.maxBands, p.other)
				assert.Len(t, p.bands, tc.maxBands+1)
			} else {
				assert.Len(t, p.bands, len(allocs))
			}
		})
	}
}

// TestLayoutTwoLevels: Recorders above and below a SubAllocator share a
// Log; each level's usage matches its own Statistics, and the segment
// view's blocks match the sub-allocator's books.
func TestLayoutTwoLevels(t *testing.T) {
	log := NewLog(0)
	below := resource.NewStatistics(NewRecorder(newHeap(), log, &RecorderOptions{Name: "blocks"}))
	sa, err := resource.NewSubAllocator(below, &resource.SubAllocatorOptions{GrowSize: 256 << 10})
	require.NoError(t, err)
	above := resource.NewStatistics(NewRecorder(sa, log, &RecorderOptions{Name: "sub"}))
	var wantAbove, wantBelow []uint64
	wantAbove = append(wantAbove, 0)
	wantBelow = append(wantBelow, 0)
	var lastBelow uint64
	run(t, above, 300, 2, func() {
		wantAbove = append(wantAbove, above.Stats().CurrentBytes)
		if b := below.Stats().CurrentBytes; b != lastBelow {
			wantBelow = append(wantBelow, b)
			lastBelow = b
		}
	})
	tr := log.Trace()
	assert.Equal(t, []string{"blocks", "sub"}, tr.Resources())
	allocs := tr.Allocations()
	checkPanel(t, layoutPanel(tr, allocs, "sub", 500), wantAbove)
	checkPanel(t, layoutPanel(tr, allocs, "blocks", 500), wantBelow)
	assert.Equal(t, map[string]bool{"blocks": true}, parents(allocs))
}

// TestSegments: at a moment with allocations live, the blocks drawn are
// the sub-allocator's: as many, as large, as full.
func TestSegments(t *testing.T) {
	log := NewLog(0)
	sa, err := resource.NewSubAllocator(NewRecorder(newHeap(), log, &RecorderOptions{Name: "blocks"}), &resource.SubAllocatorOptions{GrowSize: 256 << 10})
	require.NoError(t, err)
	mr := NewRecorder(sa, log, &RecorderOptions{Name: "sub"})
	rng := rand.New(rand.NewPCG(3, 3))
	var held []*buffer.Buffer
	for i := range 200 {
		b, err := mr.Allocate(1+rng.Uint64N(40<<10), nil)
		require.NoError(t, err)
		held = append(held, b)
		if i%3 == 0 {
			j := rng.IntN(len(held))
			require.NoError(t, held[j].Close())
			held = slices.Delete(held, j, j+1)
		}
	}
	st := sa.Stats()
	tr := log.Trace()
	allocs := tr.Allocations()
	segs := layoutSegments(allocs, len(tr.Events)-1, 256)
	t.Logf("sub-allocator: %+v", st)
	require.Greater(t, st.Blocks, 1)
	require.Greater(t, st.FreeRanges, 1, "the test needs fragmentation")
	require.Len(t, segs, st.Blocks)
	var reserved, used, free uint64
	var ranges int
	for _, s := range segs {
		assert.Equal(t, "blocks", s.resource)
		assert.False(t, s.inferred)
		reserved += s.size
		used += s.used
		free += s.free
		ranges += s.freeRanges
		var sum uint64
		for _, sp := range s.spans {
			sum += sp.size
		}
		assert.Equal(t, s.size, sum, "spans cover the block")
	}
	assert.Equal(t, st.Reserved, reserved)
	assert.Equal(t, st.Used, used)
	assert.Equal(t, st.Free, free)
	assert.Equal(t, st.FreeRanges, ranges)
	for _, b := range held {
		require.NoError(t, b.Close())
	}
}

// TestSegmentsInferred: without a recorded block, live allocations close
// together form one inferred range, far apart two.
func TestSegmentsInferred(t *testing.T) {
	allocs := []Allocation{
		{Resource: "pool", Addr: 0x1000000, Size: 1 << 20, Alloc: 0, Free: -1},
		{Resource: "pool", Addr: 0x1000000 + 3<<20, Size: 1 << 20, Alloc: 1, Free: -1},   // 2 MiB gap: same range
		{Resource: "pool", Addr: 0x1000000 + 100<<20, Size: 4 << 10, Alloc: 2, Free: -1}, // far: a new one
		{Resource: "pool", Addr: 0x9000000, Size: 1 << 20, Alloc: 0, Free: 2},            // freed
	}
	segs := layoutSegments(allocs, 2, 256)
	require.Len(t, segs, 2)
	assert.True(t, segs[0].inferred)
	assert.Equal(t, uint64(4<<20), segs[0].size)
	assert.Equal(t, uint64(2<<20), segs[0].used)
	assert.Equal(t, uint64(2<<20), segs[0].free)
	assert.Equal(t, 1, segs[0].freeRanges)
	assert.Equal(t, uint64(4<<10), segs[1].size)
	assert.Zero(t, segs[1].freeRanges)
	assert.Equal(t, 2, leafPeak(&Trace{Events: make([]Event, 3)}, allocs[:3]))
}
