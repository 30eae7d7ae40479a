package timelinesvg

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/cudamem/cudamem/resource/timeline"
)

// This file computes what the SVG draws, apart from drawing it, so that
// tests can check the numbers: the stacked bands of each resource's
// timeline and the used and free ranges of each block.

// point is a band's bottom (and, for the aggregate band, its height)
// from a step on.
type point struct {
	step           int
	bottom, height uint64
}

// band is one allocation's place in a panel: from step start to step end
// (the step of its free; steps+1 past the last step when live at the end),
// its bottom moving down as allocations below it are freed.
type band struct {
	alloc      int // index into the trace's Allocations; -1 for the aggregate
	size       uint64
	start, end int
	points     []point
}

// panel is one resource's active-memory timeline: steps are the window's
// start (step 0) and each of the resource's events; x gives each step's
// position as an index into the trace's events (-1 for the start).
type panel struct {
	resource string
	events   []int    // step k (k >= 1) is after events[k-1] of the trace
	usage    []uint64 // bytes live at each step
	peak     uint64
	peakStep int
	bands    []band // chosen bands in stacking order, then the aggregate if any
	other    int    // allocations drawn in the aggregate band
	count    int    // allocations of the resource in the window
}

// layoutPanel stacks the allocations of one resource: each chosen
// allocation (the maxBands largest) is a band from its alloc to its free,
// placed on top of those allocated before it that are still live, so
// that the stack's height at every step is the bytes in use; the others
// together form one band on top.
func layoutPanel(t *timeline.Trace, allocs []timeline.Allocation, resource string, maxBands int) panel {
	p := panel{resource: resource}
	var mine []int // indices into allocs
	for j, a := range allocs {
		if a.Resource == resource {
			mine = append(mine, j)
		}
	}
	p.count = len(mine)
	chosen := map[int]bool{}
	if len(mine) <= maxBands {
		for _, j := range mine {
			chosen[j] = true
		}
	} else {
		bySize := slices.Clone(mine)
		slices.SortStableFunc(bySize, func(a, b int) int { return cmp.Compare(allocs[b].Size, allocs[a].Size) })
		for _, j := range bySize[:maxBands] {
			chosen[j] = true
		}
		p.other = len(mine) - maxBands
	}

	// What happens at each event of this resource.
	type change struct{ free, alloc int } // allocation indices, -1 for none
	var changes []change
	for i, e := range t.Events {
		if e.Resource == resource {
			p.events = append(p.events, i)
			changes = append(changes, change{-1, -1})
		}
	}
	stepOf := make(map[int]int, len(p.events)) // event index -> step
	for k, i := range p.events {
		stepOf[i] = k + 1
	}
	for _, j := range mine {
		a := allocs[j]
		if a.Alloc >= 0 {
			changes[stepOf[a.Alloc]-1].alloc = j
		}
		if a.Free >= 0 {
			changes[stepOf[a.Free]-1].free = j
		}
	}

	bandOf := map[int]int{} // allocation -> index in p.bands
	var live []int          // band indices, bottom first
	var chosenSum, otherSum uint64
	var agg *band
	if p.other > 0 {
		agg = &band{alloc: -1}
	}
	open := func(j, step int) {
		if !chosen[j] {
			otherSum = satAdd(otherSum, allocs[j].Size)
			return
		}
		b := band{alloc: j, size: allocs[j].Size, start: step, end: len(p.events) + 1}
		b.points = []point{{step: step, bottom: chosenSum}}
		bandOf[j] = len(p.bands)
		p.bands = append(p.bands, b)
		live = append(live, bandOf[j])
		chosenSum = satAdd(chosenSum, b.size)
	}
	closeBand := func(j, step int) {
		if !chosen[j] {
			otherSum -= min(otherSum, allocs[j].Size)
			return
		}
		bi := bandOf[j]
		p.bands[bi].end = step
		pos := slices.Index(live, bi)
		live = slices.Delete(live, pos, pos+1)
		size := p.bands[bi].size
		chosenSum -= min(chosenSum, size)
		for _, above := range live[pos:] {
			b := &p.bands[above]
			last := b.points[len(b.points)-1].bottom
			b.points = append(b.points, point{step: step, bottom: last - min(last, size)})
		}
	}
	mark := func(step int) {
		u := satAdd(chosenSum, otherSum)
		p.usage = append(p.usage, u)
		if u > p.peak || step == 0 {
			p.peak, p.peakStep = u, step
		}
		if agg != nil {
			if n := len(agg.points); n == 0 || agg.points[n-1].bottom != chosenSum || agg.points[n-1].height != otherSum {
				agg.points = append(agg.points, point{step: step, bottom: chosenSum, height: otherSum})
			}
		}
	}
	for _, j := range mine {
		if allocs[j].Alloc < 0 {
			open(j, 0)
		}
	}
	mark(0)
	for k, c := range changes {
		if c.free >= 0 {
			closeBand(c.free, k+1)
		}
		if c.alloc >= 0 {
			open(c.alloc, k+1)
		}
		mark(k + 1)
	}
	if agg != nil {
		agg.end = len(p.events) + 1
		p.bands = append(p.bands, *agg)
	}
	return p
}

// parents lists the resources some of whose allocations contain an
// allocation of another resource: the upstream blocks of a
// sub-allocator, when a timeline.Recorder sits below it too.
func parents(allocs []timeline.Allocation) map[string]bool {
	type iv struct{ start, end uint64 }
	by := map[string][]iv{}
	for _, a := range allocs {
		by[a.Resource] = append(by[a.Resource], iv{a.Addr, a.Addr + a.Size})
	}
	// Per resource: intervals by start, with the largest end so far, so
	// "is [s, e) inside one of them" is a binary search.
	type index struct {
		starts, maxEnd []uint64
	}
	idx := map[string]index{}
	for r, ivs := range by {
		slices.SortFunc(ivs, func(a, b iv) int { return cmp.Compare(a.start, b.start) })
		var x index
		var m uint64
		for _, v := range ivs {
			m = max(m, v.end)
			x.starts = append(x.starts, v.start)
			x.maxEnd = append(x.maxEnd, m)
		}
		idx[r] = x
	}
	out := map[string]bool{}
	for r, x := range idx {
		for _, a := range allocs {
			if a.Resource == r || a.Size == 0 {
				continue
			}
			i := sort.Search(len(x.starts), func(i int) bool { return x.starts[i] > a.Addr }) - 1
			if i >= 0 && x.maxEnd[i] >= a.Addr+a.Size {
				out[r] = true
				break
			}
		}
	}
	return out
}

// span is a range in a block: used by an allocation (alloc >= 0) or free.
type span struct {
	addr, size uint64
	alloc      int // index into allocs; -1 for free
}

// segment is one block at the moment of the segment view: an upstream
// allocation of a parent resource, or (inferred) an address range over
// which another resource's allocations lie close together.
type segment struct {
	resource   string
	addr, size uint64
	alloc      int  // the block's allocation; -1 for an inferred range
	inferred   bool // no block was recorded: the range is the allocations' hull
	spans      []span
	used, free uint64
	freeRanges int
	largest    uint64 // largest free range
}

// inferGap is the largest gap between allocations that an inferred
// address range spans: the driver's pools map memory in 2 MiB pieces.
const inferGap = 2 << 20

// liveAt reports whether allocation a is live after event m (-1: at the
// window's start).
func liveAt(a timeline.Allocation, m int) bool {
	return a.Alloc <= m && (a.Free < 0 || a.Free > m)
}

// layoutSegments lays out the blocks live after event m: each live
// allocation of a parent resource is a block, the live allocations of
// other resources inside it (rounded up to align) are its used ranges
// and the rest is free. Live allocations inside no block are grouped per
// resource into inferred ranges.
func layoutSegments(allocs []timeline.Allocation, m int, align uint64) []segment {
	par := parents(allocs)
	var segs []segment
	var loose []int
	for j, a := range allocs {
		if !liveAt(a, m) || a.Size == 0 {
			continue
		}
		if par[a.Resource] {
			segs = append(segs, segment{resource: a.Resource, addr: a.Addr, size: a.Size, alloc: j})
		}
	}
	slices.SortFunc(segs, func(a, b segment) int {
		return cmp.Or(cmp.Compare(a.resource, b.resource), cmp.Compare(a.addr, b.addr))
	})
	inside := func(a timeline.Allocation) int {
		for i := range segs {
			s := &segs[i]
			if s.resource != a.Resource && a.Addr >= s.addr && a.Addr+a.Size <= s.addr+s.size {
				return i
			}
		}
		return -1
	}
	for j, a := range allocs {
		if !liveAt(a, m) || a.Size == 0 || par[a.Resource] {
			continue
		}
		if i := inside(a); i >= 0 {
			segs[i].spans = append(segs[i].spans, span{addr: a.Addr, size: roundUp(a.Size, align), alloc: j})
		} else {
			loose = append(loose, j)
		}
	}
	// Inferred ranges, per resource, by address.
	slices.SortFunc(loose, func(x, y int) int {
		return cmp.Or(cmp.Compare(allocs[x].Resource, allocs[y].Resource), cmp.Compare(allocs[x].Addr, allocs[y].Addr))
	})
	for _, j := range loose {
		a := allocs[j]
		sz := roundUp(a.Size, align)
		n := len(segs)
		if n > 0 && segs[n-1].inferred && segs[n-1].resource == a.Resource && a.Addr <= segs[n-1].addr+segs[n-1].size+inferGap && a.Addr >= segs[n-1].addr {
			s := &segs[n-1]
			s.size = max(s.size, a.Addr+sz-s.addr)
			s.spans = append(s.spans, span{addr: a.Addr, size: sz, alloc: j})
			continue
		}
		segs = append(segs, segment{resource: a.Resource, addr: a.Addr, size: sz, alloc: -1, inferred: true,
			spans: []span{{addr: a.Addr, size: sz, alloc: j}}})
	}
	for i := range segs {
		fillFree(&segs[i])
	}
	return segs
}

// fillFree sorts a segment's used spans, adds the free ones between them
// and sums both.
func fillFree(s *segment) {
	used := s.spans
	slices.SortFunc(used, func(a, b span) int { return cmp.Compare(a.addr, b.addr) })
	var out []span
	at := s.addr
	end := s.addr + s.size
	for _, u := range used {
		if u.addr > at {
			out = append(out, span{addr: at, size: u.addr - at, alloc: -1})
		}
		ue := min(u.addr+u.size, end)
		if ue > at {
			s.used += ue - max(at, u.addr)
		}
		out = append(out, u)
		at = max(at, ue)
	}
	if at < end {
		out = append(out, span{addr: at, size: end - at, alloc: -1})
	}
	for _, sp := range out {
		if sp.alloc < 0 {
			s.free += sp.size
			s.freeRanges++
			s.largest = max(s.largest, sp.size)
		}
	}
	s.spans = out
}

func roundUp(n, align uint64) uint64 {
	if align <= 1 {
		return n
	}
	if r := (n + align - 1) / align * align; r >= n {
		return r
	}
	return n
}

// leafPeak is the event after which the allocations of the resources
// that are not parents hold the most bytes together (-1 when nothing is
// ever live): the default moment of the segment view.
func leafPeak(t *timeline.Trace, allocs []timeline.Allocation) int {
	par := parents(allocs)
	delta := make([]int64, len(t.Events))
	var cur int64
	for _, a := range allocs {
		if par[a.Resource] {
			continue
		}
		sz := int64(min(a.Size, 1<<40)) // no overflow over many allocations
		if a.Alloc < 0 {
			cur += sz
		} else {
			delta[a.Alloc] += sz
		}
		if a.Free >= 0 {
			delta[a.Free] -= sz
		}
	}
	best, at := cur, -1
	for i, d := range delta {
		cur += d
		if cur > best {
			best, at = cur, i
		}
	}
	return at
}

// axis is the x axis of the timelines: it starts at the window's first
// event (the state before it, the window's start, is drawn there too) and
// ends at its last, and is marked at round values.
type axis struct {
	byEvent bool // positions by event index, not time
	// origin and end are the times of the first and the last event;
	// times in the picture are given from origin.
	origin, end time.Duration
	events      int
	ticks       []tick
	title       string
}

// tick is a mark on the axis at fraction f of its length.
type tick struct {
	f     float64
	value float64 // nanoseconds since origin, or events since the window's start
	label string
}

// layoutAxis lays out the x axis of t with at most maxTicks intervals
// between ticks. By time, it spans the first event to the last, ticked at
// round durations from the first; by event (or when every event has one
// time), it spans the events, ticked at round counts.
func layoutAxis(t *timeline.Trace, byEvent bool, maxTicks int) axis {
	a := axis{events: len(t.Events), byEvent: byEvent}
	if n := len(t.Events); n > 0 {
		a.origin, a.end = t.Events[0].Time, t.Events[n-1].Time
	}
	if a.end <= a.origin {
		a.byEvent = true
	}
	if a.byEvent {
		span := float64(a.events)
		step := max(niceStep(span, maxTicks), 1)
		for _, v := range tickValues(span, step) {
			a.ticks = append(a.ticks, tick{f: v / max(span, 1), value: v, label: strconv.FormatFloat(v, 'f', 0, 64)})
		}
		a.title = "events since the window's start"
		return a
	}
	span := float64(a.end - a.origin)
	step := max(niceStep(span, maxTicks), 1)
	values := tickValues(span, step)
	unit, name := durUnit(values[len(values)-1], step)
	dec := decimals(step / unit)
	for _, v := range values {
		a.ticks = append(a.ticks, tick{f: v / span, value: v, label: strconv.FormatFloat(v/unit, 'f', dec, 64) + " " + name})
	}
	a.title = "time since the first event"
	return a
}

// frac is the position, as a fraction of the axis, of the state after
// trace event i (-1: the window's start; len(Events): the end).
func (a *axis) frac(t *timeline.Trace, i int) float64 {
	var f float64
	if a.byEvent {
		f = float64(i+1) / float64(max(a.events, 1))
	} else {
		tm := a.origin
		switch {
		case i >= a.events:
			tm = a.end
		case i >= 0:
			tm = t.Events[i].Time
		}
		f = float64(tm-a.origin) / float64(a.end-a.origin)
	}
	return math.Min(math.Max(f, 0), 1)
}

// niceStep is the smallest of 1, 2 and 5 times a power of ten that cuts
// span into at most maxTicks intervals (1 for an empty span).
func niceStep(span float64, maxTicks int) float64 {
	raw := span / float64(max(maxTicks, 1))
	if !(raw > 0) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if m*p >= raw*(1-1e-12) {
			return m * p
		}
	}
	return 10 * p
}

// tickValues are the multiples of step from 0 to span.
func tickValues(span, step float64) []float64 {
	out := []float64{0}
	for k := 1; float64(k)*step <= span*(1+1e-12); k++ {
		out = append(out, float64(k)*step)
	}
	return out
}

// durUnit is the unit for ticks up to top nanoseconds apart by step: the
// largest of ns, µs, ms and s not above top (nor, for top 0, step).
func durUnit(top, step float64) (float64, string) {
	if top <= 0 {
		top = step
	}
	units := []struct {
		ns   float64
		name string
	}{{1e9, "s"}, {1e6, "ms"}, {1e3, "µs"}}
	for _, u := range units {
		if top >= u.ns {
			return u.ns, u.name
		}
	}
	return 1, "ns"
}

// decimals is how many decimals show multiples of v exactly (v one of 1,
// 2 and 5 times a power of ten).
func decimals(v float64) int {
	for d := 0; d < 9; d++ {
		s := v * math.Pow(10, float64(d))
		if math.Abs(s-math.Round(s)) < 1e-6*s {
			return d
		}
	}
	return 9
}

// byteTicks marks a panel's byte axis, 0 to peak, with at most maxTicks
// intervals at round sizes: 1, 2 or 5 times a power of ten of the largest
// of B, KiB, MiB, GiB, TiB, PiB and EiB that peak reaches (0.5 MiB, not
// 512 KiB, nor a step of a fraction of a byte); f is the fraction of peak.
func byteTicks(peak uint64, maxTicks int) []tick {
	if peak == 0 {
		return []tick{{label: "0 B"}}
	}
	span := float64(peak)
	names := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	u, unit := 0, 1.0
	for u+1 < len(names) && span >= unit*1024 {
		u, unit = u+1, unit*1024
	}
	step := niceStep(span/unit, maxTicks)
	if u == 0 {
		step = max(step, 1)
	}
	dec := decimals(step)
	var out []tick
	for _, v := range tickValues(span/unit, step) {
		out = append(out, tick{f: v * unit / span, value: v * unit, label: strconv.FormatFloat(v, 'f', dec, 64) + " " + names[u]})
	}
	return out
}

// legendEntry is one line of the picture's legend: what a kind of mark
// means. kind is "allocation", "other" or "free".
type legendEntry struct {
	kind, text string
	x, row     int // position: pixels from the legend's left, row from 0
}

// legendCharW estimates the width of a character of the legend's text,
// which has no font metrics to go by: the average of 11 px sans-serif.
const legendCharW = 6

// layoutLegend says what the marks drawn mean: only those that are drawn
// (the grey band of smaller allocations, the free ranges of blocks), laid
// out left to right in rows no wider than width pixels.
func layoutLegend(panels []panel, segs []segment, width int) []legendEntry {
	out := []legendEntry{{kind: "allocation", text: "an allocation, from its alloc to its free; the same colour in the blocks (hover for details)"}}
	if slices.ContainsFunc(panels, func(p panel) bool { return p.other > 0 }) {
		out = append(out, legendEntry{kind: "other", text: "smaller allocations, drawn together"})
	}
	if slices.ContainsFunc(segs, func(s segment) bool { return s.freeRanges > 0 }) {
		out = append(out, legendEntry{kind: "free", text: "free range of a block"})
	}
	x, row := 0, 0
	for i := range out {
		w := legendSwatchW + 4 + int(math.Ceil(float64(utf8.RuneCountInString(out[i].text))*legendCharW))
		if x > 0 && x+w > width {
			x, row = 0, row+1
		}
		out[i].x, out[i].row = x, row
		x += w + legendGap
	}
	return out
}

// Legend geometry, in pixels.
const (
	legendSwatchW = 24
	legendGap     = 20
	legendRowH    = 16
)

// satAdd is a+b, stopping at the largest uint64 rather than wrapping.
func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}
