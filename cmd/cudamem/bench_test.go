package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/staging"
)

func TestMedian(t *testing.T) {
	assert.True(t, math.IsNaN(median(nil)))
	assert.Equal(t, 3.0, median([]float64{3}))
	assert.Equal(t, 2.5, median([]float64{4, 1, 3, 2}))
	xs := []float64{5, 1, 9}
	assert.Equal(t, 5.0, median(xs))
	assert.Equal(t, []float64{5, 1, 9}, xs, "median leaves its input alone")
}

func TestSummarize(t *testing.T) {
	rs := []result{
		{Name: "b", NsPerOp: 30}, {Name: "a", NsPerOp: 10, GBps: 2}, {Name: "b", NsPerOp: 10},
		{Name: "a", NsPerOp: 20, GBps: 1}, {Name: "b", NsPerOp: 20}, {Name: "a", NsPerOp: 40, GBps: 0.5},
	}
	s := summarize(rs)
	require.Len(t, s, 2)
	assert.Equal(t, summary{Name: "b", N: 3, Median: 20, Min: 10, Max: 30}, s[0], "first appearance first")
	assert.Equal(t, summary{Name: "a", N: 3, Median: 20, Min: 10, Max: 40, GBps: 1, GBpsMin: 0.5, GBpsMax: 2}, s[1])
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"8GiB": 8 << 30, "512MiB": 512 << 20, "4KiB": 4096, "100B": 100, "2097152": 2 << 20} {
		got, err := parseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "GiB", "-1GiB", "1.5GiB", "8 GiB", "8TiB", "99999999999GiB", "0x10"} {
		_, err := parseSize(in)
		assert.Error(t, err, in)
	}
}

func TestParseBenchFlags(t *testing.T) {
	f, err := parseBenchFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, benchFlags{scale: 1, format: "table", count: 1, growTo: 8 << 30, maxCopy: 1 << 30, alternate: true}, *f)

	f, err = parseBenchFlags([]string{"-count", "5", "-format", "benchstat", "-svg", "r.svg", "-grow-to", "1GiB", "-only", "vmm", "-device", "1"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, benchFlags{device: 1, only: "vmm", scale: 1, format: "benchstat", count: 5, svg: "r.svg", growTo: 1 << 30, maxCopy: 1 << 30, alternate: true}, *f)

	f, err = parseBenchFlags([]string{"-alternate=false", "-max-copy", "64MiB", "-staging", "out=12,chunks=8x4MiB,prefault=touch,eager=false,min=1MiB,huge=true,in=4"}, io.Discard)
	require.NoError(t, err)
	assert.False(t, f.alternate)
	assert.Equal(t, uint64(64<<20), f.maxCopy)
	base := staging.Params{MinBytes: 4 << 20, OutMinBytes: 4 << 20, ChunkSize: 8 << 20, Chunks: 4, InWorkers: 8, OutWorkers: 8}
	p, err := parseStagingSpec(f.staging, base)
	require.NoError(t, err)
	assert.Equal(t, staging.Params{MinBytes: 1 << 20, OutMinBytes: 1 << 20, FreshMinBytes: 1 << 20, ChunkSize: 4 << 20, Chunks: 8, InWorkers: 4, OutWorkers: 12, Prefault: staging.PrefaultTouch, HugePages: true}, p)
	p, err = parseStagingSpec("min_in=1MiB,min_out=16MiB,min_fresh=64KiB,ahead=2,prefault=populate,fresh=16", base)
	require.NoError(t, err)
	assert.Equal(t, [5]int{1 << 20, 16 << 20, 64 << 10, 2, 16}, [5]int{p.MinBytes, p.OutMinBytes, p.FreshMinBytes, p.Ahead, p.FreshWorkers})

	f, err = parseBenchFlags([]string{"-json"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "json", f.format)

	for _, args := range [][]string{
		{"-count", "0"}, {"-iters", "0"}, {"-iters", "NaN"}, {"-format", "xml"}, {"-json", "-format", "benchstat"},
		{"-grow-to", "2MiB"}, {"-grow-to", "1000MiB1"}, {"-grow-to", "101MiB"}, {"extra"},
		{"-max-copy", "1KiB"}, {"-staging", "out"}, {"-staging", "out=0"}, {"-staging", "chunks=4"}, {"-staging", "prefault=maybe"}, {"-staging", "color=red"}, {"-staging", "fresh=-1"},
	} {
		_, err := parseBenchFlags(args, io.Discard)
		assert.Error(t, err, "%q", args)
	}
	_, err = parseBenchFlags([]string{"-h"}, io.Discard)
	assert.ErrorIs(t, err, flag.ErrHelp)
}

func TestBaselineArgs(t *testing.T) {
	f := &benchFlags{device: 1, scale: 0.5, count: 3, growTo: 1 << 30}
	assert.Equal(t, []string{"-device", "1", "-iters", "0.5", "-count", "3", "-grow-to", "1073741824", "-names", "a/c,b/c"},
		baselineArgs(f, []string{"a/c", "b/c"}))
	ms := []measurement{
		{name: "x", baseline: "a/c"}, {name: "y", baseline: "a/c", sides: []*side{{name: "z", baseline: "b/c"}}}, {name: "w"},
	}
	assert.Equal(t, []string{"a/c", "b/c"}, baselineNames(ms))
}

func TestBenchName(t *testing.T) {
	assert.Equal(t, "BenchmarkPoolpair/go/1MiB", benchName("poolpair/go/1MiB"))
	assert.Equal(t, "BenchmarkIpc/child_import", benchName("ipc/child_import"))
	assert.Equal(t, "BenchmarkA_b", benchName("a b"))
}

// benchLine is the Go benchmark format: name, iterations, value-unit pairs.
var benchLine = regexp.MustCompile(`^(Benchmark[A-Z][^\s]*)\s+(\d+)\s+([0-9.]+) ns/op(\s+[0-9.]+ MB/s)?$`)

func TestPrintBenchstat(t *testing.T) {
	rs := []result{
		{Name: "poolpair/go/1MiB", NsPerOp: 812.25, Iters: 200000, Rep: 1},
		{Name: "poolpair/go/1MiB", NsPerOp: 799.5, Iters: 200000, Rep: 2},
		{Name: "copy/dtod/go", NsPerOp: 1.25e5, GBps: 2100.5, Iters: 80, Rep: 1},
	}
	var b bytes.Buffer
	require.NoError(t, printBenchstat(&b, rs))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 6)
	assert.Regexp(t, `^goos: `, lines[0])
	assert.Regexp(t, `^goarch: `, lines[1])
	assert.Regexp(t, `^pkg: `, lines[2])
	for _, l := range lines[3:] {
		assert.Regexp(t, benchLine, l)
	}
	assert.Equal(t, "BenchmarkPoolpair/go/1MiB \t 200000 \t 812.25 ns/op", lines[3])
	assert.Equal(t, "BenchmarkCopy/dtod/go \t 80 \t 125000.00 ns/op \t 2100500.00 MB/s", lines[5])
}

// fakeResults are two repetitions of ours and the baseline's, with one
// measurement lacking a baseline figure and the concurrency rows.
func fakeResults() (ms []measurement, ours, base []result) {
	ms = []measurement{
		{name: "poolpair/go/1MiB", baseline: "poolpair/cgo/1MiB"},
		{name: "ipc/child_import", baseline: "ipc/child_import/c", sides: []*side{{name: "ipc/child_init", baseline: "ipc/child_init/c"}}},
		{name: "vmm/allocfree/16GiB", baseline: "vmm/allocfree/c/16GiB"},
		{name: "suballoc/mt/1/own", baseline: "poolpair/mt/c/1/own", rate: true, perIter: 1},
		{name: "suballoc/mt/4/own", baseline: "poolpair/mt/c/4/own", rate: true, perIter: 4},
		{name: "copy/dtod/go", baseline: "copy/dtod", bytes: 1 << 28},
	}
	for rep := 1; rep <= 2; rep++ {
		f := float64(rep)
		ours = append(ours,
			result{Name: "poolpair/go/1MiB", NsPerOp: 800 + f, Rep: rep},
			result{Name: "ipc/child_import", NsPerOp: 250e3 * f, Rep: rep},
			result{Name: "ipc/child_init", NsPerOp: 140e6, Rep: rep},
			result{Name: "vmm/allocfree/16GiB", NsPerOp: 20e6, Rep: rep},
			result{Name: "suballoc/mt/1/own", NsPerOp: 300, Rep: rep},
			result{Name: "suballoc/mt/4/own", NsPerOp: 500, Rep: rep},
			result{Name: "copy/dtod/go", NsPerOp: 1.3e5, GBps: 2000 + f, Rep: rep},
		)
		base = append(base,
			result{Name: "poolpair/cgo/1MiB", NsPerOp: 700, Rep: rep},
			result{Name: "ipc/child_import/c", NsPerOp: 218e3, Rep: rep},
			result{Name: "ipc/child_init/c", NsPerOp: 139e6, Rep: rep},
			result{Name: "poolpair/mt/c/1/own", NsPerOp: 1200, Rep: rep},
			result{Name: "poolpair/mt/c/4/own", NsPerOp: 2600, Rep: rep},
			result{Name: "copy/dtod", NsPerOp: 1.25e5, GBps: 2100, Rep: rep},
		)
	}
	return ms, ours, base
}

func TestRatioRows(t *testing.T) {
	rows := ratioRows(fakeResults())
	require.Len(t, rows, 7)
	byName := map[string]ratioRow{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	r := byName["poolpair/go/1MiB"]
	assert.InDelta(t, 801.5/700, r.Ratio(), 1e-9, "ratio of medians")
	assert.Equal(t, 801.0, r.Ours.Min)
	assert.Equal(t, 802.0, r.Ours.Max)
	assert.Equal(t, "ipc/child_init/c", byName["ipc/child_init"].Baseline, "sides keep their own baseline")
	assert.False(t, byName["vmm/allocfree/16GiB"].HasBase())
	assert.True(t, byName["suballoc/mt/4/own"].Rate)
}

func TestPrintBench(t *testing.T) {
	ms, ours, base := fakeResults()
	var b bytes.Buffer
	printBench(&b, ms, ours, base)
	out := b.String()
	assert.Contains(t, out, "median of 2")
	assert.Regexp(t, `poolpair/go/1MiB\s+801\.5 ns/op\s+801\.0 ns–802\.0 ns\s+poolpair/cgo/1MiB\s+700\.0 ns/op\s+700\.0 ns–700\.0 ns\s+1\.15x`, out)
	assert.Regexp(t, `ipc/child_init\s+140\.00 ms/op`, out)
	assert.Regexp(t, `vmm/allocfree/16GiB\s+20\.00 ms/op\s+20\.00 ms–20\.00 ms\s+vmm/allocfree/c/16GiB\s+-`, out)
	assert.Regexp(t, `copy/dtod/go\s+2001\.5 GB/s`, out)
	// The concurrency table: pairs/s and scaling against one goroutine.
	assert.Regexp(t, `suballoc/mt/4/own\s+2\.00M/s\s+0\.60x\s+385k/s\s+0\.46x\s+5\.20x`, out)

	b.Reset()
	printBench(&b, ms[:1], ours[:1], base[:1])
	assert.NotContains(t, b.String(), "median of", "one repetition: no spread")
	assert.NotContains(t, b.String(), "min–max")
	assert.Regexp(t, `poolpair/go/1MiB\s+801\.0 ns/op\s+poolpair/cgo/1MiB\s+700\.0 ns/op\s+1\.14x`, b.String())
	assert.NotContains(t, b.String(), "concurrency")
}

func TestWriteSVG(t *testing.T) {
	rows := ratioRows(fakeResults())
	withBase := 0
	for _, r := range rows {
		if r.HasBase() {
			withBase++
		}
	}
	var b bytes.Buffer
	require.NoError(t, writeSVG(&b, rows))
	bars, texts := checkSVG(t, b.Bytes())
	assert.Equal(t, withBase, bars, "one bar per measurement with a baseline")
	joined := strings.Join(texts, "\n")
	assert.Contains(t, joined, "poolpair/go/1MiB")
	assert.Contains(t, joined, "C 700.0 ns/op", "the C figure is labelled")
	assert.Contains(t, joined, "÷", "text is written as UTF-8")
	// The legend says what the colours and the dashed line mean.
	assert.Equal(t, 3, strings.Count(b.String(), `<g class="legend">`))
	for _, label := range []string{"cudamem within 1.2x of C", "more than 1.2x C's time", "1.0x: as fast as C"} {
		assert.Contains(t, texts, label)
	}
	assert.Contains(t, b.String(), `fill="`+svgFillNear+`"/><text`, "the legend's swatches are the bars' colours")
	assert.Contains(t, b.String(), `fill="`+svgFillSlow+`"/><text`)

	// Names that need escaping, and no rows at all.
	b.Reset()
	require.NoError(t, writeSVG(&b, []ratioRow{{Name: `a<b>&"c"`, Baseline: "x", Ours: summary{N: 1, Median: 2}, Base: summary{N: 1, Median: 1}}}))
	bars, texts = checkSVG(t, b.Bytes())
	assert.Equal(t, 1, bars)
	assert.Contains(t, strings.Join(texts, "\n"), `a<b>&"c"`)
	b.Reset()
	require.NoError(t, writeSVG(&b, nil))
	bars, _ = checkSVG(t, b.Bytes())
	assert.Zero(t, bars)
}

// checkSVG parses an SVG document with encoding/xml, and returns its
// number of bars (rect elements of class "bar") and its texts.
func checkSVG(t *testing.T, doc []byte) (bars int, texts []string) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(doc))
	root := ""
	depth := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "%s", doc)
		switch el := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				root = el.Name.Local
				assert.Equal(t, "http://www.w3.org/2000/svg", el.Name.Space)
			}
			depth++
			if el.Name.Local == "rect" {
				for _, a := range el.Attr {
					if a.Name.Local == "class" && a.Value == "bar" {
						bars++
					}
				}
			}
			if el.Name.Local == "text" {
				var s string
				require.NoError(t, d.DecodeElement(&s, &el))
				texts = append(texts, s)
				depth--
			}
		case xml.EndElement:
			depth--
		}
	}
	assert.Equal(t, "svg", root)
	assert.Zero(t, depth, "every element closed")
	return bars, texts
}

func TestMtKey(t *testing.T) {
	g, mode, ok := mtKey("suballoc/mt/16/shared")
	assert.True(t, ok)
	assert.Equal(t, 16, g)
	assert.Equal(t, "shared", mode)
	for _, s := range []string{"suballoc/mt/x/own", "suballoc/mt/4", "poolpair/mt/c/4/own", "suballoc/mt/0/own"} {
		_, _, ok := mtKey(s)
		assert.False(t, ok, s)
	}
}

func TestParseChildReport(t *testing.T) {
	rep, err := parseChildReport([]byte(`{"init_ns":139000000,"import_ns":218000,"first":[42,42,42,42]}` + "\n"))
	require.NoError(t, err)
	assert.Equal(t, int64(218000), rep.ImportNs)
	for _, bad := range []string{
		``, `{}`, `{"init_ns":1,"import_ns":1,"first":[]}`, `{"init_ns":1,"import_ns":1,"first":[42,0,42,42]}`,
		`{"init_ns":0,"import_ns":1,"first":[42]}`, `not json`,
	} {
		_, err := parseChildReport([]byte(bad))
		assert.Error(t, err, bad)
	}
}

// runOurs reports progress on stderr, never on stdout; skips are reported
// and leave the measurement out; other errors are returned (and marked in
// the results: see TestBenchKeepsResultsWhenOneFails).
func TestRunOurs(t *testing.T) {
	calls := 0
	sd := &side{name: "s", baseline: "s/c"}
	setups := 0
	ms := []measurement{
		{name: "a", iters: 100, perIter: 4, setup: func() error { setups++; return nil }, sides: []*side{sd},
			run: func(n int) (time.Duration, error) {
				calls++
				sd.d = time.Duration(n) * 8 * time.Nanosecond
				return time.Duration(n) * 4 * time.Microsecond, nil
			}},
		{name: "b", iters: 1, skip: "no such device feature"},
		{name: "c", iters: 1, run: func(int) (time.Duration, error) { return 0, skipf("needs 16GiB") }},
	}
	var stderr bytes.Buffer
	rs, err := runOurs(ms, 1, 3, &stderr, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, setups)
	assert.Equal(t, 4, calls, "a warm-up and three repetitions")
	require.Len(t, rs, 6)
	for i, r := range rs {
		if i%2 == 0 {
			assert.Equal(t, result{Name: "a", NsPerOp: 1000, Iters: 400, Rep: i/2 + 1}, r)
		} else {
			assert.Equal(t, result{Name: "s", NsPerOp: 2, Iters: 400, Rep: i/2 + 1}, r)
		}
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	assert.Equal(t, []string{
		"bench: [1/3] a (3 × 100 iterations)",
		"bench: [2/3] b (3 × 1 iterations)",
		"bench: skipped b: no such device feature",
		"bench: [3/3] c (3 × 1 iterations)",
		"bench: skipped c: needs 16GiB",
	}, lines)

	_, err = runOurs([]measurement{{name: "d", iters: 1, run: func(int) (time.Duration, error) { return 0, errors.New("boom") }}}, 1, 1, io.Discard, nil)
	assert.ErrorContains(t, err, "d: boom")
}

// runBaseline passes the flags on, relays the program's progress lines
// to stderr and reads its JSON lines.
func TestRunBaseline(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("uses a shell script")
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "cgo-baseline")
	require.NoError(t, os.WriteFile(script, []byte(`#!/bin/sh
echo "cgo-baseline: [1/1] a/c args: $*" >&2
echo '{"name":"a/c","ns_per_op":2.5,"iters":10,"rep":1}'
echo '{"name":"a/c","ns_per_op":3.5,"iters":10,"rep":2}'
`), 0o755))
	var stderr bytes.Buffer
	f := &benchFlags{baseline: script, scale: 1, count: 2, growTo: 1 << 30}
	rs, err := runBaseline(f, []string{"a/c"}, &stderr)
	require.NoError(t, err)
	assert.Equal(t, []result{{Name: "a/c", NsPerOp: 2.5, Iters: 10, Rep: 1}, {Name: "a/c", NsPerOp: 3.5, Iters: 10, Rep: 2}}, rs)
	assert.Contains(t, stderr.String(), "args: -device 0 -iters 1 -count 2 -grow-to 1073741824 -names a/c")

	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho 'cgo-baseline: dlopen libcuda.so.1: no such file' >&2\nexit 1\n"), 0o755))
	_, err = runBaseline(f, []string{"a/c"}, io.Discard)
	assert.ErrorContains(t, err, "exit status 1: cgo-baseline: dlopen libcuda.so.1: no such file")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho garbage\n"), 0o755))
	_, err = runBaseline(f, []string{"a/c"}, io.Discard)
	assert.ErrorContains(t, err, `printed "garbage"`)
}

func TestTailBuffer(t *testing.T) {
	var tb tailBuffer
	_, _ = tb.Write(bytes.Repeat([]byte("x"), 5000))
	_, _ = tb.Write([]byte("end"))
	assert.Len(t, tb.String(), 4096)
	assert.True(t, strings.HasSuffix(tb.String(), "xend"))
}

// One measurement failing does not lose the others: runOurs goes on, the
// table, JSON, benchstat and chart show every figure there is, the failed
// measurement is marked FAILED, and bench fails naming it.
func TestBenchKeepsResultsWhenOneFails(t *testing.T) {
	ok := func(ns int) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) { return time.Duration(n*ns) * time.Nanosecond, nil }
	}
	ms := []measurement{
		{name: "poolpair/go/1MiB", baseline: "poolpair/cgo/1MiB", iters: 10, run: ok(800)},
		{name: "copy/dtod/go", baseline: "copy/dtod", iters: 10, bytes: 1 << 20, run: func(n int) (time.Duration, error) {
			return 0, errors.New("cuMemcpyAsync: CUDA_ERROR_ILLEGAL_ADDRESS")
		}},
		{name: "trivial/go", baseline: "trivial/cgo", iters: 10, run: ok(90)},
	}
	var stderr bytes.Buffer
	ours, err := runOurs(ms, 1, 2, &stderr, nil)
	require.ErrorContains(t, err, "copy/dtod/go: cuMemcpyAsync: CUDA_ERROR_ILLEGAL_ADDRESS")
	require.Len(t, ours, 5, "two repetitions each of the two that ran, one failure")
	assert.Equal(t, result{Name: "copy/dtod/go", Error: "cuMemcpyAsync: CUDA_ERROR_ILLEGAL_ADDRESS"}, ours[2])
	assert.Contains(t, stderr.String(), "bench: FAILED copy/dtod/go: cuMemcpyAsync")
	assert.Contains(t, stderr.String(), "bench: [3/3] trivial/go", "the next measurement ran")
	base := []result{
		{Name: "poolpair/cgo/1MiB", NsPerOp: 700, Rep: 1}, {Name: "copy/dtod", NsPerOp: 1e5, GBps: 2000, Rep: 1},
		{Name: "trivial/cgo", NsPerOp: 80, Rep: 1},
	}

	// The table.
	var stdout bytes.Buffer
	stderr.Reset()
	err = report("table", nil, ms, ours, base, nil, &stdout, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 of 3 measurements failed")
	assert.Contains(t, err.Error(), "\n  copy/dtod/go: cuMemcpyAsync: CUDA_ERROR_ILLEGAL_ADDRESS")
	out := stdout.String()
	assert.Regexp(t, `poolpair/go/1MiB\s+800\.0 ns/op\s+800\.0 ns–800\.0 ns\s+poolpair/cgo/1MiB\s+700\.0 ns/op\s+-\s+1\.14x`, out)
	assert.Regexp(t, `copy/dtod/go\s+FAILED\s+-\s+copy/dtod\s+2000\.0 GB/s\s+-\s+-\n`, out)
	assert.Regexp(t, `trivial/go\s+90\.0 ns/op`, out)

	// JSON: every result, the failure with its error.
	stdout.Reset()
	require.Error(t, report("json", nil, ms, ours, base, nil, &stdout, io.Discard))
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	require.Len(t, lines, 8)
	assert.JSONEq(t, `{"name":"copy/dtod/go","ns_per_op":0,"iters":0,"error":"cuMemcpyAsync: CUDA_ERROR_ILLEGAL_ADDRESS"}`, lines[2])

	// benchstat: the lines that have figures, all well-formed.
	stdout.Reset()
	require.Error(t, report("benchstat", nil, ms, ours, base, nil, &stdout, io.Discard))
	bl := strings.Split(strings.TrimSpace(stdout.String()), "\n")[3:]
	assert.Len(t, bl, 7)
	for _, l := range bl {
		assert.Regexp(t, benchLine, l)
		assert.NotContains(t, l, "Copy/dtod/go")
	}

	// The chart: a bar for each measurement that has both figures.
	dir := t.TempDir()
	svg, err := openOut("-svg", filepath.Join(dir, "r.svg"), nil)
	require.NoError(t, err)
	stderr.Reset()
	require.Error(t, report("table", svg, ms, ours, base, nil, io.Discard, &stderr))
	data, err := os.ReadFile(filepath.Join(dir, "r.svg"))
	require.NoError(t, err)
	bars, _ := checkSVG(t, data)
	assert.Equal(t, 2, bars)
	assert.Contains(t, stderr.String(), "bench: wrote ")

	// Nothing failed: no error. A baseline that stopped early is said so.
	stderr.Reset()
	good := []result{ours[0], ours[1], ours[3], ours[4]}
	require.NoError(t, report("table", nil, ms, good, base[:1], errors.New("cgo-baseline: exit status 1"), io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "the C baseline stopped early")
	stderr.Reset()
	require.NoError(t, report("table", nil, ms, good, nil, errors.New("not found"), io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "no C baseline: not found")
}

// A baseline program that fails partway keeps the figures it printed.
func TestRunBaselineKeepsPartialResults(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("uses a shell script")
	}
	script := filepath.Join(t.TempDir(), "cgo-baseline")
	require.NoError(t, os.WriteFile(script, []byte(`#!/bin/sh
echo '{"name":"a/c","ns_per_op":2.5,"iters":10,"rep":1}'
echo 'cgo-baseline: b/c: cuMemAlloc failed' >&2
exit 1
`), 0o755))
	f := &benchFlags{baseline: script, scale: 1, count: 1, growTo: 1 << 30}
	rs, err := runBaseline(f, []string{"a/c", "b/c"}, io.Discard)
	assert.ErrorContains(t, err, "b/c: cuMemAlloc failed")
	assert.Equal(t, []result{{Name: "a/c", NsPerOp: 2.5, Iters: 10, Rep: 1}}, rs)
}

// Without a baseline beside the binary, the message says how to build one
// from a clone of the repository (no path outside it).
func TestBaselineNotFoundMessage(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(filepath.Dir(exe), "cgo-baseline")); err == nil {
		t.Skip("a cgo-baseline lies beside the test binary")
	}
	_, err = runBaseline(&benchFlags{scale: 1, count: 1, growTo: 1 << 30}, []string{"a/c"}, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CGO_ENABLED=1 go build -o cgo-baseline ./testdata/cgobench")
	assert.Contains(t, err.Error(), "-cgo PATH")
	assert.NotContains(t, err.Error(), "../")
}

// Every setup runs before the first measurement is timed, as the C
// baseline's do; a setup that fails marks its measurement FAILED and the
// others still run.
func TestRunOursSetsUpFirst(t *testing.T) {
	var log []string
	mk := func(name string, setupErr error) measurement {
		return measurement{name: name, iters: 1,
			setup: func() error { log = append(log, "setup "+name); return setupErr },
			run: func(int) (time.Duration, error) {
				log = append(log, "run "+name)
				return time.Millisecond, nil
			}}
	}
	ms := []measurement{mk("a", nil), mk("b", errors.New("no pool")), mk("c", nil), mk("d", skipf("no VMM here"))}
	var stderr bytes.Buffer
	ours, err := runOurs(ms, 1, 1, &stderr, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "b: setup: no pool")
	assert.NotContains(t, err.Error(), "d:", "a setup that skips is no failure")
	assert.Contains(t, stderr.String(), "bench: skipped d: no VMM here")
	assert.Equal(t, []string{"setup a", "setup b", "setup c", "setup d", "run a", "run a", "run c", "run c"}, log)
	var names []string
	for _, r := range ours {
		names = append(names, r.Name+"/"+r.Error)
	}
	assert.Equal(t, []string{"a/", "b/setup: no pool", "c/"}, names)
}
