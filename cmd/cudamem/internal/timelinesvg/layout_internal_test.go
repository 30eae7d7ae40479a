package timelinesvg

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/timeline"
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

// TestLayoutMatchesStatistics: a Statistics over a timeline.Recorder, random
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
			log := timeline.NewLog(tc.capacity)
			rec := timeline.NewRecorder(newHeap(), log, &timeline.RecorderOptions{Name: "heap"})
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
// timeline.Log; each level's usage matches its own Statistics, and the segment
// view's blocks match the sub-allocator's books.
func TestLayoutTwoLevels(t *testing.T) {
	log := timeline.NewLog(0)
	below := resource.NewStatistics(timeline.NewRecorder(newHeap(), log, &timeline.RecorderOptions{Name: "blocks"}))
	sa, err := resource.NewSubAllocator(below, &resource.SubAllocatorOptions{GrowSize: 256 << 10})
	require.NoError(t, err)
	above := resource.NewStatistics(timeline.NewRecorder(sa, log, &timeline.RecorderOptions{Name: "sub"}))
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
	log := timeline.NewLog(0)
	sa, err := resource.NewSubAllocator(timeline.NewRecorder(newHeap(), log, &timeline.RecorderOptions{Name: "blocks"}), &resource.SubAllocatorOptions{GrowSize: 256 << 10})
	require.NoError(t, err)
	mr := timeline.NewRecorder(sa, log, &timeline.RecorderOptions{Name: "sub"})
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
	allocs := []timeline.Allocation{
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
	assert.Equal(t, 2, leafPeak(&timeline.Trace{Events: make([]timeline.Event, 3)}, allocs[:3]))
}

// isRound reports whether v is 1, 2 or 5 times a power of ten.
func isRound(v float64) bool {
	if v <= 0 {
		return false
	}
	m := v / math.Pow(10, math.Floor(math.Log10(v)+1e-9))
	for _, r := range []float64{1, 2, 5} {
		if math.Abs(m-r) < 1e-6 {
			return true
		}
	}
	return false
}

// checkTicks asserts ticks from 0 at a round step, at most maxTicks
// intervals, covering span (the last within it, one more step past it).
func checkTicks(t *testing.T, ticks []tick, span float64, maxTicks int) float64 {
	t.Helper()
	require.NotEmpty(t, ticks)
	assert.Zero(t, ticks[0].value, "the first tick is at the axis's start")
	assert.Zero(t, ticks[0].f)
	assert.LessOrEqual(t, len(ticks)-1, maxTicks, "at most %d intervals", maxTicks)
	if len(ticks) == 1 {
		return 0
	}
	step := ticks[1].value
	assert.True(t, isRound(step), "step %v is 1, 2 or 5 times a power of ten", step)
	for k, tk := range ticks {
		assert.InDelta(t, float64(k)*step, tk.value, step*1e-9, "tick %d", k)
		assert.InDelta(t, tk.value/span, tk.f, 1e-9, "tick %d's position", k)
	}
	last := ticks[len(ticks)-1].value
	assert.LessOrEqual(t, last, span*(1+1e-9))
	assert.Greater(t, last+step, span, "no room left for another tick")
	return step
}

// The time axis starts at the first event, not at the timeline.Log's clock origin
// (12.41 ms earlier here: the axis showed nothing but empty room before
// it), and is marked at round durations from there; by event, at round
// counts.
func TestAxisStartsAtFirstEventWithRoundTicks(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	tr := &timeline.Trace{Events: []timeline.Event{
		{Seq: 1, Time: ms(12.41), Kind: timeline.Alloc, Addr: 0x1000, Size: 10},
		{Seq: 2, Time: ms(13), Kind: timeline.Alloc, Addr: 0x2000, Size: 10},
		{Seq: 3, Time: ms(15.2), Kind: timeline.Free, Addr: 0x1000, Size: 10},
		{Seq: 4, Time: ms(17.76), Kind: timeline.Free, Addr: 0x2000, Size: 10},
	}}
	a := layoutAxis(tr, false, 10)
	assert.False(t, a.byEvent)
	assert.Equal(t, ms(12.41), a.origin)
	assert.Zero(t, a.frac(tr, -1), "the window's start at the left end")
	assert.Zero(t, a.frac(tr, 0), "the first event at the left end")
	assert.InDelta(t, (15.2-12.41)/(17.76-12.41), a.frac(tr, 2), 1e-9)
	assert.Equal(t, 1.0, a.frac(tr, 3), "the last event at the right end")
	assert.Equal(t, 1.0, a.frac(tr, 4), "the end")
	var labels []string
	for _, tk := range a.ticks {
		labels = append(labels, tk.label)
	}
	assert.Equal(t, []string{"0 ms", "1 ms", "2 ms", "3 ms", "4 ms", "5 ms"}, labels)
	assert.Equal(t, float64(time.Millisecond), checkTicks(t, a.ticks, float64(ms(17.76-12.41)), 10))
	assert.Equal(t, "time since the first event", a.title)

	// Fewer ticks: the step grows to the next round one; decimals where
	// the step is a fraction of the unit.
	labels = nil
	for _, tk := range layoutAxis(tr, false, 2).ticks {
		labels = append(labels, tk.label)
	}
	assert.Equal(t, []string{"0 ms", "5 ms"}, labels)
	short := &timeline.Trace{Events: []timeline.Event{{Seq: 1, Time: ms(3)}, {Seq: 2, Time: ms(4.5)}}}
	labels = nil
	for _, tk := range layoutAxis(short, false, 4).ticks {
		labels = append(labels, tk.label)
	}
	assert.Equal(t, []string{"0.0 ms", "0.5 ms", "1.0 ms", "1.5 ms"}, labels)

	// By event: round counts of events.
	many := &timeline.Trace{Events: make([]timeline.Event, 437)}
	for i := range many.Events {
		many.Events[i] = timeline.Event{Seq: uint64(i + 1), Time: time.Duration(i) * time.Microsecond}
	}
	e := layoutAxis(many, true, 10)
	assert.True(t, e.byEvent)
	assert.Equal(t, 50.0, checkTicks(t, e.ticks, 437, 10))
	assert.Equal(t, "400", e.ticks[len(e.ticks)-1].label)
	assert.Equal(t, "events since the window's start", e.title)
	assert.Zero(t, e.frac(many, -1))
	assert.Equal(t, 1.0, e.frac(many, 436))

	// Every event at one time: by event, whatever was asked.
	same := &timeline.Trace{Events: []timeline.Event{{Seq: 1, Time: ms(2)}, {Seq: 2, Time: ms(2)}}}
	assert.True(t, layoutAxis(same, false, 10).byEvent)
	assert.Equal(t, []tick{{label: "0"}}, layoutAxis(&timeline.Trace{}, false, 10).ticks, "no events: one tick")
}

// Over spans from a nanosecond to days and any number of ticks, the
// ticks are round, cover the span and fit.
func TestAxisTicksProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for range 2000 {
		span := time.Duration(math.Pow(10, rng.Float64()*14)) + 1
		maxTicks := 1 + rng.IntN(15)
		tr := &timeline.Trace{Events: []timeline.Event{{Seq: 1, Time: 7 * time.Second}, {Seq: 2, Time: 7*time.Second + span}}}
		a := layoutAxis(tr, false, maxTicks)
		require.False(t, a.byEvent)
		step := checkTicks(t, a.ticks, float64(span), maxTicks)
		for _, tk := range a.ticks {
			require.NotContains(t, tk.label, "e", "no exponents: %q", tk.label)
		}
		if len(a.ticks) > 1 {
			require.NotEqual(t, a.ticks[0].label, a.ticks[1].label, "labels tell ticks apart (step %v)", step)
		}
		if t.Failed() {
			t.Fatalf("span %v, %d ticks", span, maxTicks)
		}
	}
}

// The byte axis is marked at round sizes in binary units.
func TestByteTicks(t *testing.T) {
	labels := func(peak uint64, n int) []string {
		var out []string
		ticks := byteTicks(peak, n)
		for _, tk := range ticks {
			out = append(out, tk.label)
			assert.LessOrEqual(t, tk.value, float64(peak))
			assert.InDelta(t, tk.value/float64(max(peak, 1)), tk.f, 1e-12)
		}
		assert.LessOrEqual(t, len(ticks)-1, n)
		return out
	}
	assert.Equal(t, []string{"0 MiB", "10 MiB", "20 MiB"}, labels(28_200<<10, 4))
	assert.Equal(t, []string{"0 B", "200 B", "400 B", "600 B"}, labels(700, 4))
	assert.Equal(t, []string{"0 KiB", "1 KiB", "2 KiB", "3 KiB"}, labels(3<<10, 4))
	assert.Equal(t, []string{"0.0 MiB", "0.5 MiB", "1.0 MiB"}, labels(1102336, 4), "in the largest unit reached")
	assert.Equal(t, []string{"0 KiB", "500 KiB", "1000 KiB"}, labels(1000<<10, 4), "below 1 MiB")
	assert.Equal(t, []string{"0 B", "1 B", "2 B", "3 B"}, labels(3, 10), "no fractions of a byte")
	assert.Equal(t, []string{"0 B"}, labels(0, 4))
	assert.Equal(t, []string{"0 EiB", "5 EiB", "10 EiB", "15 EiB"}, labels(^uint64(0), 4))
}

// The legend names what is drawn, and only that: the grey band only when
// some allocations are drawn together, free ranges only when a block has
// one; it wraps into rows no wider than the plot.
func TestLegend(t *testing.T) {
	kinds := func(es []legendEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.kind)
		}
		return out
	}
	one := []panel{{resource: "a"}}
	assert.Equal(t, []string{"allocation"}, kinds(layoutLegend(one, nil, 1100)))
	grey := []panel{{resource: "a"}, {resource: "b", other: 3}}
	full := []segment{{freeRanges: 0}}
	holey := []segment{{freeRanges: 0}, {freeRanges: 2}}
	assert.Equal(t, []string{"allocation", "other"}, kinds(layoutLegend(grey, full, 1100)))
	assert.Equal(t, []string{"allocation", "free"}, kinds(layoutLegend(one, holey, 1100)))
	all := layoutLegend(grey, holey, 1100)
	assert.Equal(t, []string{"allocation", "other", "free"}, kinds(all))
	for _, e := range all {
		assert.Zero(t, e.row, "one row at 1100 px")
	}
	assert.Less(t, all[0].x, all[1].x)
	assert.Less(t, all[1].x, all[2].x)

	narrow := layoutLegend(grey, holey, 400)
	for i, e := range narrow {
		w := legendSwatchW + 4 + int(math.Ceil(float64(utf8.RuneCountInString(e.text))*legendCharW))
		if e.x > 0 {
			assert.LessOrEqual(t, e.x+w, 400, "entry %d fits its row", i)
		} else {
			assert.Zero(t, e.x)
		}
		if i > 0 && e.row == narrow[i-1].row {
			assert.Greater(t, e.x, narrow[i-1].x)
		}
	}
	assert.Greater(t, narrow[len(narrow)-1].row, 0, "wrapped")
}
