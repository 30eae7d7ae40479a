package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
)

// SVG chart geometry, in pixels.
const (
	svgLabelW = 330 // measurement names
	svgBarW   = 420 // the bar area: the largest ratio fills it
	svgNoteW  = 330 // the ratio and both figures
	svgRowH   = 22
	svgTop    = 48
	svgBottom = 64 // the axis labels, then the legend
	// slowRatio is the ratio above which a bar is drawn in the "slower"
	// colour.
	slowRatio = 1.2
)

// Bar colours: within slowRatio of the baseline, and beyond it.
const (
	svgFillNear = "#4c78a8"
	svgFillSlow = "#e45756"
)

// charted reports whether r gets a bar: our measurement and its baseline
// both have a figure, and the ratio is a finite positive number.
func charted(r ratioRow) bool {
	ratio := r.Ratio()
	return r.Ours.Err == "" && r.HasBase() && ratio > 0 && !math.IsInf(ratio, 0) && !math.IsNaN(ratio)
}

// writeSVG draws one horizontal bar per measurement that has a baseline
// figure: its length is the ratio of median times (cudamem ÷ baseline),
// a dashed line marks 1.0x, and the text beside it gives the ratio and
// both figures (the C baseline's labelled as such). It is plain SVG 1.1,
// written by hand, with every text escaped. A legend under the axis says
// what the colours and the dashed line mean.
func writeSVG(w io.Writer, rows []ratioRow) error {
	var bars []ratioRow
	for _, r := range rows {
		if charted(r) {
			bars = append(bars, r)
		}
	}
	top := 1.5 // the scale reaches at least 1.5x, so 1.0x is always drawn
	for _, r := range bars {
		top = math.Max(top, r.Ratio())
	}
	top = math.Ceil(top*4) / 4
	width := svgLabelW + svgBarW + svgNoteW
	height := svgTop + svgRowH*max(1, len(bars)) + svgBottom
	x := func(ratio float64) float64 { return svgLabelW + ratio/top*svgBarW }

	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(s)) // writes to memory: cannot fail
		return e.String()
	}
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">
`, width, height, width, height)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>
`, width, height)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>
`, esc("cudamem bench: time per operation, cudamem ÷ C baseline (median; lower is better)"))
	if len(bars) == 0 {
		fmt.Fprintf(&b, `<text x="10" y="%d">%s</text>
`, svgTop+14, esc("no measurement has a baseline figure"))
	}
	for i, r := range bars {
		y := svgTop + i*svgRowH
		fill := svgFillNear
		if r.Ratio() > slowRatio {
			fill = svgFillSlow
		}
		ours, _ := cell(r.Ours, r.Rate)
		base, _ := cell(r.Base, r.Rate)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>
`, svgLabelW-8, y+15, esc(r.Name))
		fmt.Fprintf(&b, `<rect class="bar" x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>
`, svgLabelW, y+3, x(r.Ratio())-svgLabelW, svgRowH-6, fill,
			esc(fmt.Sprintf("%s: %.2fx (cudamem %s, %s %s)", r.Name, r.Ratio(), ours, r.Baseline, base)))
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>
`, svgLabelW+svgBarW+8, y+15, esc(fmt.Sprintf("%.2fx   cudamem %s, C %s", r.Ratio(), ours, base)))
	}
	axisY := svgTop + svgRowH*max(1, len(bars))
	one := x(1)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black" stroke-dasharray="4 3"/>
`, one, svgTop-6, one, axisY)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>
`, svgLabelW, axisY, svgLabelW+svgBarW, axisY)
	for t := 0.0; t <= top+1e-9; t += tickStep(top) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>
`, x(t), axisY+16, esc(fmt.Sprintf("%gx", t)))
	}
	// The legend: what the colours and the dashed line mean.
	ly := axisY + 40
	lx := svgLabelW
	item := func(mark, label string) {
		fmt.Fprintf(&b, `<g class="legend">%s<text x="%d" y="%d">%s</text></g>
`, mark, lx+22, ly+4, esc(label))
		lx += 22 + 7*len([]rune(label)) + 24
	}
	item(fmt.Sprintf(`<rect x="%d" y="%d" width="16" height="10" fill="%s"/>`, lx, ly-5, svgFillNear),
		fmt.Sprintf("cudamem within %.1fx of C", slowRatio))
	item(fmt.Sprintf(`<rect x="%d" y="%d" width="16" height="10" fill="%s"/>`, lx, ly-5, svgFillSlow),
		fmt.Sprintf("more than %.1fx C's time", slowRatio))
	item(fmt.Sprintf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black" stroke-dasharray="4 3"/>`, lx, ly, lx+16, ly),
		"1.0x: as fast as C")
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// tickStep is the spacing of the axis labels for a scale up to top.
func tickStep(top float64) float64 {
	switch {
	case top <= 2:
		return 0.25
	case top <= 5:
		return 0.5
	case top <= 10:
		return 1
	}
	return math.Ceil(top / 10)
}
