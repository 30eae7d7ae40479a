// Package timelinesvg draws a timeline.Trace as the SVG picture that
// `cudamem timeline` writes: each resource's memory over time, stacked by
// allocation, and the blocks at one moment with their used and free
// ranges (see Write).
package timelinesvg

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource/timeline"
)

// Options configures Write. A nil *Options means the zero value.
type Options struct {
	// Title heads the picture; "" means "cudamem memory timeline".
	Title string
	// Width is the picture's width in pixels; 0 means 1200.
	Width int
	// PanelHeight is the height of each resource's timeline; 0 means 300.
	PanelHeight int
	// MaxBands is how many allocations of each resource are drawn as
	// bands of their own (the largest); the rest are drawn together as
	// one band on top. 0 means 500.
	MaxBands int
	// ByEvent spaces the x axis by event, not by time: bursts of
	// allocations spread out, idle times vanish. (A trace whose events
	// all have one time is drawn so too.)
	ByEvent bool
	// Resources are the resources to draw a timeline of, in order; nil
	// means each resource of the trace, in the order it first appears.
	Resources []string
	// SegmentsAt is the Seq of the event after which the segment view
	// shows the blocks; 0 means the moment when the allocations not
	// themselves holding others (the leaves) held the most bytes.
	SegmentsAt uint64
	// MaxSegments caps the rows of the segment view; 0 means 64.
	MaxSegments int
	// Alignment rounds allocations up in the segment view, so that
	// the padding an allocator adds is not shown as free; 0 means 256
	// (the sub-allocator's and the driver's alignment), 1 turns it off.
	Alignment uint64
}

func (o *Options) withDefaults() Options {
	var v Options
	if o != nil {
		v = *o
	}
	if v.Title == "" {
		v.Title = "cudamem memory timeline"
	}
	if v.Width <= 0 {
		v.Width = 1200
	}
	v.Width = max(v.Width, 400)
	if v.PanelHeight <= 0 {
		v.PanelHeight = 300
	}
	v.PanelHeight = max(v.PanelHeight, 80)
	if v.MaxBands <= 0 {
		v.MaxBands = 500
	}
	if v.MaxSegments <= 0 {
		v.MaxSegments = 64
	}
	if v.Alignment == 0 {
		v.Alignment = 256
	}
	return v
}

// Picture geometry, in pixels.
const (
	marginL   = 80
	marginR   = 20
	legendTop = 40 // the legend's first row, under the title and summary
	panelGap  = 50
	rowH      = 34
	barH      = 16
	tickSpace = 100 // the least room between two ticks of the time axis
)

// palette holds the band colours (a band's colour follows from its
// allocation's sequence number, so the segment view uses the same).
var palette = []string{
	"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
	"#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#ff7f0e",
	"#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf", "#bcbd22",
}

func colour(seq uint64) string {
	h := fnv.New32a()
	var b [8]byte
	for i := range b {
		b[i] = byte(seq >> (8 * i))
	}
	h.Write(b[:])
	return palette[h.Sum32()%uint32(len(palette))]
}

// Write draws trace t on w as an SVG picture, hand-written (no
// dependency):
//
//   - for each resource, its active memory over time, as PyTorch's
//     _memory_viz draws it: each allocation a band from its alloc to its
//     free, stacked on those made before it that are still live, so the
//     stack's outline is the bytes in use;
//   - a segment view: each block live at one moment (SegmentsAt) as a bar
//     of its used and free ranges. A block is an allocation of a resource
//     whose allocations contain others' (a timeline.Recorder below a
//     SubAllocator records its upstream blocks); neither the driver's
//     pools nor resource.SubAllocator expose a block map, so the view is
//     built from the recorded events. Allocations inside no recorded
//     block are grouped into address ranges inferred from the
//     allocations themselves (gaps up to 2 MiB), labelled as such.
//
// A legend says what the marks drawn mean. The time axis starts at the
// window's first event and is marked at round durations from it (1, 2 or
// 5 times a power of ten), and every time the picture gives is from that
// event; the byte axes are marked at round sizes. A resource named "" is
// labelled "(unnamed)".
//
// Every band is a <path class="band"> with data-resource, data-addr,
// data-size, data-alloc-seq and data-free-seq (0 when live at the end)
// attributes and a <title> for tooltips; the block rows are <g
// class="segment"> with data-addr, data-size, data-used, data-free and
// data-free-ranges, and the time axis's ticks are <text class="tick">
// with data-value (nanoseconds from the first event, or events), so the
// picture can be checked or scraped.
func Write(w io.Writer, t *timeline.Trace, opts *Options) error {
	if w == nil {
		return cuda.Errorf("timelinesvg.Write", cuda.ErrInvalidArgument, "nil writer")
	}
	if t == nil {
		t = &timeline.Trace{Version: timeline.TraceVersion}
	}
	o := opts.withDefaults()
	allocs := t.Allocations()
	resources := o.Resources
	if resources == nil {
		resources = t.Resources()
	}
	panels := make([]panel, len(resources))
	for i, r := range resources {
		panels[i] = layoutPanel(t, allocs, r, o.MaxBands)
	}
	m := leafPeak(t, allocs)
	if o.SegmentsAt != 0 {
		m = slices.IndexFunc(t.Events, func(e timeline.Event) bool { return e.Seq >= o.SegmentsAt })
		if m < 0 || t.Events[m].Seq != o.SegmentsAt {
			return cuda.Errorf("timelinesvg.Write", cuda.ErrInvalidArgument, "SegmentsAt %d is no event of the trace", o.SegmentsAt)
		}
	}
	segs := layoutSegments(allocs, m, o.Alignment)
	shown := min(len(segs), o.MaxSegments)

	d := &drawing{w: bufio.NewWriter(w), o: o, t: t, allocs: allocs, names: resourceLabels(t.Resources())}
	d.x0, d.x1 = float64(marginL), float64(o.Width-marginR)
	d.ax = layoutAxis(t, o.ByEvent, max(2, int(d.x1-d.x0)/tickSpace))
	legend := layoutLegend(panels, segs[:shown], int(d.x1-d.x0))
	head := legendTop + (legend[len(legend)-1].row+1)*legendRowH + 4
	segTop := head + len(panels)*(o.PanelHeight+panelGap)
	height := segTop + 30 + shown*rowH + 20
	if shown < len(segs) {
		height += rowH
	}
	d.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", o.Width, height, o.Width, height)
	d.printf("<style>.band{stroke:#fff;stroke-width:0.3}.other{fill:#ccc}.free{fill:#eee;stroke:#bbb;stroke-width:0.5}.axis{stroke:#444;stroke-width:1}.grid{stroke:#ddd;stroke-width:0.5}text.h{font-size:14px;font-weight:bold}text.axis-title{fill:#555}</style>\n")
	d.printf(`<rect width="100%%" height="100%%" fill="#fff"/>` + "\n")
	summary := plural(len(t.Events), "event") + ", " + plural(len(allocs), "allocation")
	if t.Dropped > 0 {
		summary += fmt.Sprintf(", %d older events dropped (%d allocations from before the window)", t.Dropped, len(t.Before))
	}
	if d.ax.origin > 0 {
		summary += fmt.Sprintf("; times are from the first event, %s after the log started", durStr(d.ax.origin))
	}
	d.printf(`<text class="h" x="%d" y="20">%s</text>`, marginL, esc(o.Title))
	d.printf(`<text x="%d" y="34">%s</text>`+"\n", marginL, esc(summary))
	d.legend(legend)
	for i := range panels {
		d.panel(&panels[i], head+i*(o.PanelHeight+panelGap)+20)
	}
	d.segments(segs[:shown], len(segs), m, segTop)
	d.printf("</svg>\n")
	if d.err != nil {
		return &cuda.OpError{Op: "timelinesvg.Write", Err: d.err}
	}
	if err := d.w.Flush(); err != nil {
		return &cuda.OpError{Op: "timelinesvg.Write", Err: err}
	}
	return nil
}

type drawing struct {
	w      *bufio.Writer
	err    error
	o      Options
	t      *timeline.Trace
	allocs []timeline.Allocation
	names  map[string]string // resource -> label (resourceLabels)
	x0, x1 float64           // plot range in pixels
	ax     axis
}

func (d *drawing) printf(format string, args ...any) {
	if d.err == nil {
		_, d.err = fmt.Fprintf(d.w, format, args...)
	}
}

// xOf is the x position of the state after trace event i (-1: the start;
// len(Events): the end).
func (d *drawing) xOf(i int) float64 {
	return d.x0 + d.ax.frac(d.t, i)*(d.x1-d.x0)
}

// at is a time of the trace as the picture gives it: from the first event.
func (d *drawing) at(tm time.Duration) string { return durStr(tm - d.ax.origin) }

// name labels a resource ("" gets a name of its own).
func (d *drawing) name(r string) string {
	if l, ok := d.names[r]; ok {
		return l
	}
	if r == "" {
		return "(unnamed)"
	}
	return r
}

// legend draws what the marks mean.
func (d *drawing) legend(entries []legendEntry) {
	d.printf(`<g class="legend">` + "\n")
	for _, e := range entries {
		x, y := d.x0+float64(e.x), float64(legendTop+e.row*legendRowH)
		d.printf(`<g class="legend-entry" data-kind="%s">`, e.kind)
		switch e.kind {
		case "allocation":
			for i := range 3 {
				d.printf(`<rect x="%.1f" y="%.1f" width="8" height="10" fill="%s"/>`, x+float64(8*i), y, palette[i])
			}
		case "other":
			d.printf(`<rect x="%.1f" y="%.1f" width="%d" height="10" fill="#ccc"/>`, x, y, legendSwatchW)
		case "free":
			d.printf(`<rect x="%.1f" y="%.1f" width="%d" height="10" fill="#eee" stroke="#bbb" stroke-width="0.5"/>`, x, y, legendSwatchW)
		}
		d.printf(`<text x="%.1f" y="%.1f">%s</text></g>`+"\n", x+legendSwatchW+4, y+9, esc(e.text))
	}
	d.printf("</g>\n")
}

// stepX is the x position of a panel's step k.
func (d *drawing) stepX(p *panel, k int) float64 {
	if k == 0 {
		return d.xOf(-1)
	}
	if k > len(p.events) {
		return d.xOf(len(d.t.Events))
	}
	return d.xOf(p.events[k-1])
}

func (d *drawing) panel(p *panel, top int) {
	o := d.o
	plotTop, plotH := float64(top+16), float64(o.PanelHeight-16)
	bottom := plotTop + plotH
	peak := max(p.peak, 1)
	y := func(b uint64) float64 { return bottom - float64(b)/float64(peak)*plotH }
	drawn := len(p.bands)
	if p.other > 0 {
		drawn--
	}
	d.printf(`<g class="panel" data-resource="%s" data-peak="%d" data-allocations="%d" data-bands="%d">`+"\n", esc(p.resource), p.peak, p.count, drawn)
	label := fmt.Sprintf("%s: active memory, peak %s", d.name(p.resource), bytesStr(p.peak))
	if p.peakStep > 0 {
		label += " at " + d.stepLabel(p, p.peakStep)
	}
	label += ", " + plural(p.count, "allocation")
	if p.other > 0 {
		label += fmt.Sprintf(" (%d smallest drawn together in grey)", p.other)
	}
	d.printf(`<text class="h" x="%.0f" y="%d">%s</text>`+"\n", d.x0, top+8, esc(label))
	// Axes and grid.
	for _, tk := range byteTicks(p.peak, max(2, int(plotH)/60)) {
		yy := bottom - tk.f*plotH
		d.printf(`<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/><text class="ytick" data-value="%s" x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			d.x0, yy, d.x1, yy, strconv.FormatFloat(tk.value, 'f', -1, 64), d.x0-4, yy+4, esc(tk.label))
	}
	for _, tk := range d.ax.ticks {
		xx := d.x0 + tk.f*(d.x1-d.x0)
		anchor := "middle"
		switch {
		case tk.f == 0:
			anchor = "start"
		case tk.f > 0.98:
			anchor = "end"
		}
		d.printf(`<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/><text class="tick" data-value="%s" x="%.1f" y="%.1f" text-anchor="%s">%s</text>`+"\n",
			xx, plotTop, xx, bottom+4, strconv.FormatFloat(tk.value, 'f', -1, 64), xx, bottom+14, anchor, esc(tk.label))
	}
	d.printf(`<text class="axis-title" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", (d.x0+d.x1)/2, bottom+28, esc(d.ax.title))
	d.printf(`<line class="axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/><line class="axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`+"\n",
		d.x0, plotTop, d.x0, bottom, d.x0, bottom, d.x1, bottom)
	for bi := range p.bands {
		b := &p.bands[bi]
		if b.alloc < 0 {
			d.aggregate(p, b, y)
			continue
		}
		d.band(p, b, y)
	}
	d.printf("</g>\n")
}

// band draws one allocation: the bottom edge left to right, stepping down
// where an allocation below is freed, then the top edge back.
func (d *drawing) band(p *panel, b *band, y func(uint64) float64) {
	a := d.allocs[b.alloc]
	var sb strings.Builder
	xs := func(k int) string { return strconv.FormatFloat(d.stepX(p, k), 'f', 2, 64) }
	ys := func(v uint64) string { return strconv.FormatFloat(y(v), 'f', 2, 64) }
	sb.WriteString("M" + xs(b.start) + " " + ys(b.points[0].bottom))
	for _, pt := range b.points[1:] {
		sb.WriteString("H" + xs(pt.step) + "V" + ys(pt.bottom))
	}
	last := b.points[len(b.points)-1].bottom
	sb.WriteString("H" + xs(b.end) + "V" + ys(satAdd(last, b.size)))
	for i := len(b.points) - 1; i >= 1; i-- {
		sb.WriteString("H" + xs(b.points[i].step) + "V" + ys(satAdd(b.points[i-1].bottom, b.size)))
	}
	sb.WriteString("H" + xs(b.start) + "Z")
	var freeSeq uint64
	if a.Free >= 0 {
		freeSeq = d.t.Events[a.Free].Seq
	}
	d.printf(`<path class="band" fill="%s" data-resource="%s" data-addr="%#x" data-size="%d" data-alloc-seq="%d" data-free-seq="%d" d="%s"><title>%s</title></path>`+"\n",
		colour(a.AllocSeq), esc(a.Resource), a.Addr, a.Size, a.AllocSeq, freeSeq, sb.String(), esc(d.describe(a)))
}

// aggregate draws the band of the allocations not drawn on their own.
func (d *drawing) aggregate(p *panel, b *band, y func(uint64) float64) {
	var sb strings.Builder
	xs := func(k int) string { return strconv.FormatFloat(d.stepX(p, k), 'f', 2, 64) }
	ys := func(v uint64) string { return strconv.FormatFloat(y(v), 'f', 2, 64) }
	pts := b.points
	sb.WriteString("M" + xs(pts[0].step) + " " + ys(pts[0].bottom))
	for _, pt := range pts[1:] {
		sb.WriteString("H" + xs(pt.step) + "V" + ys(pt.bottom))
	}
	lastPt := pts[len(pts)-1]
	sb.WriteString("H" + xs(b.end) + "V" + ys(satAdd(lastPt.bottom, lastPt.height)))
	for i := len(pts) - 1; i >= 1; i-- {
		sb.WriteString("H" + xs(pts[i].step) + "V" + ys(satAdd(pts[i-1].bottom, pts[i-1].height)))
	}
	sb.WriteString("H" + xs(pts[0].step) + "Z")
	d.printf(`<path class="other" data-resource="%s" data-count="%d" d="%s"><title>%d smaller allocations of %s</title></path>`+"\n",
		esc(p.resource), p.other, sb.String(), p.other, esc(d.name(p.resource)))
}

func (d *drawing) describe(a timeline.Allocation) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %#x, %s (%d bytes), stream %#x, device %d\n", d.name(a.Resource), a.Addr, bytesStr(a.Size), a.Size, a.Stream, a.Device)
	if a.Alloc >= 0 {
		fmt.Fprintf(&sb, "allocated at %s (event %d)\n", d.at(d.t.Events[a.Alloc].Time), a.AllocSeq)
	} else {
		fmt.Fprintf(&sb, "allocated before the window (event %d)\n", a.AllocSeq)
	}
	if a.Free >= 0 {
		fmt.Fprintf(&sb, "freed at %s (event %d)\n", d.at(d.t.Events[a.Free].Time), d.t.Events[a.Free].Seq)
	} else {
		sb.WriteString("live at the end\n")
	}
	for _, f := range a.Stack {
		sb.WriteString("  " + f + "\n")
	}
	return strings.TrimSuffix(sb.String(), "\n")
}

func (d *drawing) stepLabel(p *panel, k int) string {
	e := d.t.Events[p.events[k-1]]
	return fmt.Sprintf("%s (event %d)", d.at(e.Time), e.Seq)
}

func (d *drawing) segments(segs []segment, total, m int, top int) {
	at := "the start of the window"
	var seq uint64
	if m >= 0 {
		e := d.t.Events[m]
		seq = e.Seq
		at = fmt.Sprintf("after event %d (%s)", e.Seq, d.at(e.Time))
	}
	d.printf(`<g class="segments" data-seq="%d" data-segments="%d">`+"\n", seq, total)
	head := fmt.Sprintf("Blocks %s: used and free ranges (from the recorded events; no resource exposes its block map)", at)
	if total == 0 {
		head = fmt.Sprintf("Blocks %s: nothing live", at)
	}
	d.printf(`<text class="h" x="%.0f" y="%d">%s</text>`+"\n", d.x0, top+14, esc(head))
	for i, s := range segs {
		yy := float64(top + 30 + i*rowH)
		kind := "block"
		if s.inferred {
			kind = "address range inferred from its allocations"
		}
		label := fmt.Sprintf("%s %s %#x, %s: %s used in %s, ",
			d.name(s.resource), kind, s.addr, bytesStr(s.size), bytesStr(s.used), plural(len(s.spans)-s.freeRanges, "range"))
		if s.freeRanges == 0 {
			label += "nothing free"
		} else {
			label += fmt.Sprintf("%s free in %s (largest %s)", bytesStr(s.free), plural(s.freeRanges, "range"), bytesStr(s.largest))
		}
		d.printf(`<g class="segment" data-resource="%s" data-addr="%#x" data-size="%d" data-used="%d" data-free="%d" data-free-ranges="%d" data-inferred="%t">`+"\n",
			esc(s.resource), s.addr, s.size, s.used, s.free, s.freeRanges, s.inferred)
		d.printf(`<text x="%.0f" y="%.1f">%s</text>`+"\n", d.x0, yy+10, esc(label))
		scale := (d.x1 - d.x0) / float64(max(s.size, 1))
		for _, sp := range s.spans {
			x := d.x0 + float64(sp.addr-s.addr)*scale
			wd := math.Max(float64(sp.size)*scale, 0.5)
			if sp.alloc < 0 {
				d.printf(`<rect class="free" x="%.2f" y="%.1f" width="%.2f" height="%d" data-addr="%#x" data-size="%d"><title>free %#x, %s</title></rect>`+"\n",
					x, yy+13, wd, barH, sp.addr, sp.size, sp.addr, esc(bytesStr(sp.size)))
				continue
			}
			a := d.allocs[sp.alloc]
			d.printf(`<rect class="used" fill="%s" x="%.2f" y="%.1f" width="%.2f" height="%d" data-addr="%#x" data-size="%d"><title>%s</title></rect>`+"\n",
				colour(a.AllocSeq), x, yy+13, wd, barH, sp.addr, sp.size, esc(d.describe(a)))
		}
		d.printf("</g>\n")
	}
	if len(segs) < total {
		d.printf(`<text x="%.0f" y="%d">... and %d more</text>`+"\n", d.x0, top+30+len(segs)*rowH+12, total-len(segs))
	}
	d.printf("</g>\n")
}

// esc escapes text for XML content and attribute values; characters XML
// cannot hold become U+FFFD.
func esc(s string) string {
	var sb strings.Builder
	_ = xml.EscapeText(&sb, []byte(s)) // a strings.Builder does not fail
	return sb.String()
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

func bytesStr(n uint64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(n, 10) + " B"
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		f /= unit
		if f < unit {
			return strconv.FormatFloat(f, 'f', 1, 64) + " " + u
		}
	}
	return strconv.FormatFloat(f/unit, 'f', 1, 64) + " EiB"
}

func durStr(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + " ns"
	case d < time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) + " µs"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + " ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 3, 64) + " s"
}

// resourceLabels names each resource for the picture, as the Chrome trace
// export of package timeline does: a resource named "" gets a name no other
// resource of the trace has.
func resourceLabels(resources []string) map[string]string {
	out := make(map[string]string, len(resources))
	for _, r := range resources {
		out[r] = r
	}
	if _, ok := out[""]; ok {
		name := "(unnamed)"
		for i := 2; slices.Contains(resources, name); i++ {
			name = fmt.Sprintf("(unnamed %d)", i)
		}
		out[""] = name
	}
	return out
}
