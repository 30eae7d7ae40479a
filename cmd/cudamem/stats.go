package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"
)

// summary is what the repetitions of one measurement come to: the median
// and the spread (min–max) of the time per operation, and of the
// bandwidth where there is one.
type summary struct {
	Name             string
	N                int // repetitions
	Median, Min, Max float64
	GBps             float64 // median bandwidth; 0 for latency measurements
	GBpsMin, GBpsMax float64
	Err              string // why the measurement failed; N is 0 then
	// Pairs are the repetitions' ratios to their paired baseline
	// repetitions (result.Pair), in order.
	Pairs []float64
}

// median returns the median of xs (the mean of the middle two for an even
// count); NaN for none. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// summarize groups results by name, in order of first appearance. A
// failed measurement's summary has its error and no figures.
func summarize(rs []result) []summary {
	var order []string
	by := map[string][]result{}
	for _, r := range rs {
		if _, ok := by[r.Name]; !ok {
			order = append(order, r.Name)
		}
		by[r.Name] = append(by[r.Name], r)
	}
	out := make([]summary, 0, len(order))
	for _, name := range order {
		var ns, gb, pairs []float64
		failed := ""
		for _, r := range by[name] {
			if r.Error != "" {
				failed = cmp.Or(failed, r.Error)
				continue
			}
			ns = append(ns, r.NsPerOp)
			if r.Pair > 0 {
				pairs = append(pairs, r.Pair)
			}
			if r.GBps > 0 {
				gb = append(gb, r.GBps)
			}
		}
		if failed != "" || len(ns) == 0 {
			out = append(out, summary{Name: name, Err: cmp.Or(failed, "no results")})
			continue
		}
		s := summary{Name: name, N: len(ns), Median: median(ns), Min: slices.Min(ns), Max: slices.Max(ns), Pairs: pairs}
		if len(gb) > 0 {
			s.GBps, s.GBpsMin, s.GBpsMax = median(gb), slices.Min(gb), slices.Max(gb)
		}
		out = append(out, s)
	}
	return out
}

func summaryMap(rs []result) map[string]summary {
	m := map[string]summary{}
	for _, s := range summarize(rs) {
		m[s.Name] = s
	}
	return m
}

// ratioRow is one line of the table and one bar of the chart: our
// measurement, its baseline (Base.N == 0 when the baseline has no
// figure), and the ratio of their median times.
type ratioRow struct {
	Name, Baseline string
	Rate           bool // shown as operations per second
	Ours, Base     summary
}

// HasBase reports whether the baseline has a figure.
func (r ratioRow) HasBase() bool { return r.Base.N > 0 }

// Failed reports whether our measurement failed (Ours.Err says why).
func (r ratioRow) Failed() bool { return r.Ours.Err != "" }

// Ratio is ours ÷ baseline, median time per operation (lower is better).
func (r ratioRow) Ratio() float64 { return r.Ours.Median / r.Base.Median }

// ratioRows pairs our summaries with the baseline's, in measurement order;
// measurements that did not run (skipped) are left out.
func ratioRows(ms []measurement, ours, base []result) []ratioRow {
	type meta struct {
		baseline string
		rate     bool
	}
	info := map[string]meta{}
	for _, m := range ms {
		info[m.name] = meta{m.baseline, m.rate}
		for _, s := range m.sides {
			info[s.name] = meta{s.baseline, false}
		}
	}
	bs := summaryMap(base)
	var rows []ratioRow
	for _, o := range summarize(ours) {
		mi := info[o.Name]
		rows = append(rows, ratioRow{Name: o.Name, Baseline: mi.baseline, Rate: mi.rate, Ours: o, Base: bs[mi.baseline]})
	}
	return rows
}

// fmtTime formats nanoseconds per operation with a unit that suits it.
func fmtTime(ns float64) string {
	switch {
	case ns < 10_000:
		return fmt.Sprintf("%.1f ns", ns)
	case ns < 10_000_000:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	}
	return fmt.Sprintf("%.2f ms", ns/1e6)
}

// fmtRate formats operations per second, given ns per operation.
func fmtRate(ns float64) string {
	r := 1e9 / ns
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM/s", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.0fk/s", r/1e3)
	}
	return fmt.Sprintf("%.1f/s", r)
}

// cell is the figure of s (the median), spread the min–max.
func cell(s summary, rate bool) (fig, spread string) {
	switch {
	case s.GBps > 0:
		fig = fmt.Sprintf("%.1f GB/s", s.GBps)
		spread = fmt.Sprintf("%.1f–%.1f", s.GBpsMin, s.GBpsMax)
	case rate:
		fig = fmtRate(s.Median)
		spread = fmtRate(s.Max) + "–" + fmtRate(s.Min)
	default:
		fig = fmtTime(s.Median) + "/op"
		spread = fmtTime(s.Min) + "–" + fmtTime(s.Max)
	}
	if s.N < 2 {
		spread = "-"
	}
	return fig, spread
}

func printBench(w io.Writer, ms []measurement, ours, base []result) {
	// The host-copy families have tables of their own, below.
	rows := slices.DeleteFunc(ratioRows(ms, ours, base), func(r ratioRow) bool {
		return strings.HasPrefix(r.Name, hostCopyPrefix) || strings.HasPrefix(r.Name, sweepPrefix) || strings.HasPrefix(r.Name, ceilingPrefix)
	})
	reps := 1
	for _, r := range rows {
		reps = max(reps, r.Ours.N, r.Base.N)
	}
	if len(rows) == 0 {
		printHostCopies(w, ours)
		printSweep(w, ours)
		printCeilings(w, ours)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	spread := reps > 1 // the min–max columns, for -count above 1
	paired := slices.ContainsFunc(rows, func(r ratioRow) bool { return len(r.Ours.Pairs) > 0 })
	head := []string{"measurement", "cudamem", "baseline", "C baseline", "ratio (time, cudamem/baseline)"}
	if spread {
		head = []string{fmt.Sprintf("measurement (median of %d)", reps), "cudamem", "min–max", "baseline", "C baseline", "min–max", "ratio (time, cudamem/baseline)"}
	}
	if paired {
		head = append(head, "paired runs: median ratio (each pair)")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range rows {
		fig, sp := cell(r.Ours, r.Rate)
		if r.Failed() {
			fig, sp = "FAILED", "-"
		}
		bfig, bsp, ratio := "-", "-", "-"
		if r.HasBase() {
			bfig, bsp = cell(r.Base, r.Rate)
			if !r.Failed() {
				ratio = fmt.Sprintf("%.2fx", r.Ratio())
			}
		}
		cols := []string{r.Name, fig, r.Baseline, bfig, ratio}
		if spread {
			cols = []string{r.Name, fig, sp, r.Baseline, bfig, bsp, ratio}
		}
		if paired {
			cols = append(cols, pairCell(r.Ours.Pairs))
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	tw.Flush()
	printScaling(w, rows, extraMedians(ours))
	printHostCopies(w, ours)
	printSweep(w, ours)
	printCeilings(w, ours)
}

// pairCell is the paired-runs column: the median of the pair ratios and
// each of them, in order.
func pairCell(pairs []float64) string {
	if len(pairs) == 0 {
		return "-"
	}
	each := make([]string, len(pairs))
	for i, p := range pairs {
		each[i] = fmt.Sprintf("%.2f", p)
	}
	return fmt.Sprintf("%.2fx (%s)", median(pairs), strings.Join(each, " "))
}

// mtKey parses "suballoc/mt/16/own" into (16, "own").
func mtKey(name string) (g int, mode string, ok bool) {
	rest, ok := strings.CutPrefix(name, mtPrefix)
	if !ok {
		return 0, "", false
	}
	gs, mode, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, "", false
	}
	g, err := strconv.Atoi(gs)
	if err != nil || g < 1 {
		return 0, "", false
	}
	return g, mode, true
}

// printScaling prints the concurrency table: pairs per second of each
// suballoc/mt measurement and its baseline, and each against its own
// one-goroutine (one-thread) figure.
//
// Beside them, from ex (extraMedians): the collections per run and their
// share of the CPU, and when the first and the median goroutine finished,
// as a fraction of the run's wall time (1.00 and 1.00: all ended together;
// a low median: the run waited for stragglers).
func printScaling(w io.Writer, rows []ratioRow, ex map[string]map[string]float64) {
	one := map[string]ratioRow{}
	var mt []ratioRow
	for _, r := range rows {
		g, mode, ok := mtKey(r.Name)
		if !ok {
			continue
		}
		mt = append(mt, r)
		if g == 1 {
			one[mode] = r
		}
	}
	if len(mt) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "concurrency (256 B pairs)\tcudamem pairs/s\tvs 1 goroutine\tC driver pool pairs/s\tvs 1 thread\tcudamem/C throughput\tGC cycles/run\tGC CPU\tfirst/median goroutine end")
	for _, r := range mt {
		_, mode, _ := mtKey(r.Name)
		vs := func(s, first summary) string {
			if s.N == 0 || first.N == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2fx", first.Median/s.Median)
		}
		base, thr := "-", "-"
		ours := fmtRate(r.Ours.Median)
		if r.Failed() {
			ours = "FAILED"
		}
		if r.HasBase() {
			base = fmtRate(r.Base.Median)
			if !r.Failed() {
				thr = fmt.Sprintf("%.2fx", r.Base.Median/r.Ours.Median)
			}
		}
		gc, share, ends := "-", "-", "-"
		if x := ex[r.Name]; x != nil {
			gc = fmt.Sprintf("%.0f", x["gc_cycles"])
			if v, ok := x["gc_cpu_share"]; ok {
				share = fmt.Sprintf("%.0f%%", 100*v)
			}
			if _, ok := x["median_end"]; ok {
				ends = fmt.Sprintf("%.2f/%.2f", x["first_end"], x["median_end"])
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, ours, vs(r.Ours, one[mode].Ours),
			base, vs(r.Base, one[mode].Base), thr, gc, share, ends)
	}
	tw.Flush()
}

// benchName turns a measurement name into a Go benchmark name:
// "poolpair/go/1MiB" becomes "BenchmarkPoolpair/go/1MiB". Spaces, which
// would end the name, become underscores.
func benchName(name string) string {
	name = strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, name)
	r, n := utf8.DecodeRuneInString(name)
	return "Benchmark" + string(unicode.ToUpper(r)) + name[n:]
}

// printBenchstat prints the results in the Go benchmark format, one line
// per repetition, for benchstat: ns/op always, MB/s for copies and fills.
// Failed measurements have no line (their errors go to stderr).
func printBenchstat(w io.Writer, rs []result) error {
	if _, err := fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/cudamem/cudamem/cmd/cudamem\n", runtime.GOOS, runtime.GOARCH); err != nil {
		return err
	}
	for _, r := range rs {
		if r.Error != "" {
			continue
		}
		line := fmt.Sprintf("%s \t %d \t %.2f ns/op", benchName(r.Name), max(1, r.Iters), r.NsPerOp)
		if r.GBps > 0 {
			line += fmt.Sprintf(" \t %.2f MB/s", r.GBps*1e3)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}
