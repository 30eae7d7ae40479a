package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/staging"
)

// result is one repetition of one measurement; the C baseline program
// prints the same shape.
type result struct {
	Name    string  `json:"name"`
	NsPerOp float64 `json:"ns_per_op"`
	GBps    float64 `json:"gbps,omitempty"`
	Iters   int     `json:"iters"`
	Rep     int     `json:"rep,omitempty"` // 1-based repetition (-count)
	// Error, when set, says why the measurement failed; it has no
	// figures then. Other measurements still run and are reported.
	Error string `json:"error,omitempty"`
	// Extra holds a measurement's further figures for the repetition
	// (a staged copy's breakdown: DMA wait, memcpy, page faults).
	Extra map[string]float64 `json:"extra,omitempty"`
	// Pair is this repetition's time ÷ that of its baseline's repetition
	// run next to it (alternated runs; see benchpair.go); 0 when there
	// was none.
	Pair float64 `json:"pair_ratio,omitempty"`
}

// measurement is one benchmark of ours and the baseline it is compared to.
type measurement struct {
	name     string // ours, e.g. "poolpair/go/1MiB"
	baseline string // the C program's name, e.g. "poolpair/cgo/1MiB"
	iters    int
	bytes    uint64 // per iteration, for GB/s; 0 for latency measurements
	// perIter is the number of operations one iteration makes (0 means
	// one): ns/op divides the time by iters×perIter. The concurrency
	// measurements make one pair per goroutine per iteration.
	perIter int
	// rate reports the figure as operations per second (throughput).
	rate bool
	// setup, if set, runs once before the measurement's first run, and
	// only when the measurement is selected (so -only skips its cost).
	// Cleanups go to benchEnv.cleanup.
	setup func() error
	// skip, if set, says why the measurement cannot run here; it is
	// reported on stderr and the measurement left out.
	skip string
	// run performs n iterations and returns the time they took.
	run func(n int) (time.Duration, error)
	// sides are further figures that each run fills in (for example the
	// child's start-up time beside ipc/child_import); each becomes a row
	// of its own, divided by the same operation count.
	sides []*side
	// extra, if set, returns the further figures of the run just made
	// (result.Extra).
	extra func() map[string]float64
}

// side is a figure a measurement's run reports besides its own.
type side struct {
	name, baseline string
	d              time.Duration // set by run: the total over its n iterations
}

// ops is the number of operations n iterations of m make.
func (m *measurement) ops(n int) int {
	return n * max(1, m.perIter)
}

// skipError marks a measurement that cannot run here (not enough memory,
// a feature the device lacks): reported, not a failure.
type skipError struct{ reason string }

func (e *skipError) Error() string { return e.reason }

func skipf(format string, args ...any) error {
	return &skipError{reason: fmt.Sprintf(format, args...)}
}

type benchEnv struct {
	dev     *cuda.Device
	stream  *cuda.Stream
	cleanup []func() error
	growTo  uint64    // -grow-to: the size vmm/growstep grows to
	stderr  io.Writer // for notes beside the figures (nil: none)
	// staging is the staging parameters every measurement but the
	// host-copy sweeps runs with (-staging over the defaults).
	staging staging.Params
	host    *hostBufs // the host-copy measurements' memory
}

// close runs the cleanups in reverse order and joins their errors.
func (e *benchEnv) close() error {
	var errs []error
	for i := len(e.cleanup) - 1; i >= 0; i-- {
		errs = append(errs, e.cleanup[i]())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	return nil
}

// benchFlags are bench's command line.
type benchFlags struct {
	device    int
	only      string
	scale     float64
	baseline  string
	format    string // table, benchstat or json
	lock      bool
	count     int
	svg       string
	growTo    uint64
	cpuProf   string
	maxCopy   uint64 // -max-copy
	staging   string // -staging
	alternate bool   // -alternate
	log       string // -log
}

// sizeFlag is a byte size flag that takes 8GiB, 512MiB, 4096 and so on.
type sizeFlag struct{ p *uint64 }

func (f sizeFlag) String() string {
	if f.p == nil {
		return ""
	}
	return sizeLabel(*f.p)
}

func (f sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*f.p = n
	return nil
}

// parseSize parses a byte count with an optional B, KiB, MiB or GiB suffix.
func parseSize(s string) (uint64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}, {"", 0}}
	for _, u := range units {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		var n uint64
		if _, err := fmt.Sscanf(num, "%d", &n); err != nil || num == "" || fmt.Sprint(n) != num {
			return 0, fmt.Errorf("bad size %q: want a whole number of B, KiB, MiB or GiB, e.g. 8GiB", s)
		}
		if n > (^uint64(0))>>u.shift {
			return 0, fmt.Errorf("size %q overflows", s)
		}
		return n << u.shift, nil
	}
	return 0, fmt.Errorf("bad size %q", s)
}

// parseBenchFlags parses bench's arguments (CPU-testable).
func parseBenchFlags(args []string, stderr io.Writer) (*benchFlags, error) {
	f := &benchFlags{growTo: 8 << 30, maxCopy: defaultMaxCopy}
	fs := newFlagSet("bench", stderr)
	fs.IntVar(&f.device, "device", 0, "run on the GPU with ordinal `ORDINAL`")
	fs.StringVar(&f.only, "only", "", "run only measurements whose name starts with `PREFIX`")
	fs.Float64Var(&f.scale, "iters", 1, "multiply iteration counts by `X`")
	fs.StringVar(&f.baseline, "cgo", "", "`PATH` of the C baseline program (testdata/cgobench); default: cgo-baseline beside this binary, if present")
	asJSON := fs.Bool("json", false, "print JSON lines (one per repetition) instead of a table; the same as -format json")
	fs.StringVar(&f.format, "format", "table", "output `FORMAT`: table (medians, spreads and ratios), benchstat (Go benchmark lines, one per repetition) or json")
	fs.BoolVar(&f.lock, "lock", false, "lock the benchmarking goroutine to one OS thread (as the C baseline is); cudamem never needs it, this shows what thread affinity is worth")
	fs.BoolVar(&f.alternate, "alternate", true, "run the C baseline beside ours, each repetition of ours next to one of its baseline's (the order swapping each time), and print the ratio of each pair; false: the baseline runs after all of ours")
	fs.IntVar(&f.count, "count", 1, "run each measurement (ours and the baseline's) `N` times; the table shows medians and min–max")
	fs.StringVar(&f.svg, "svg", "", "also write an SVG bar chart of the ratios to the C baseline to `FILE` (needs the baseline)")
	fs.StringVar(&f.log, "log", "", "also append every figure to `FILE` as a JSON line the moment it is measured (the baseline's too), so that a run cut short keeps what it measured")
	fs.StringVar(&f.cpuProf, "cpuprofile", "", "also write a CPU profile of cudamem's side of the measurements to `FILE`, for go tool pprof (the C baseline runs in a process of its own)")
	fs.Var(sizeFlag{&f.growTo}, "grow-to", "`SIZE` vmm/growstep grows one allocation to, in 2 MiB steps (e.g. 8GiB, 1GiB)")
	fs.Var(sizeFlag{&f.maxCopy}, "max-copy", "the largest `SIZE` the hostcopy and staging measurements copy (from 4KiB)")
	fs.StringVar(&f.staging, "staging", "", "staging parameters for every measurement but the staging sweep, as `SETTINGS` over the defaults, comma-separated: min=SIZE (min_in, min_out, min_fresh: one way, or out into fresh memory), chunks=COUNTxSIZE, in=N, out=N, fresh=N (workers; fresh: out into fresh memory, 0 for out's), prefault=off|touch|populate, eager=BOOL, huge=BOOL, ahead=N (goroutines mapping pages ahead, with prefault=populate)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	}
	if !(f.scale > 0) || f.scale > 1e6 {
		return nil, fmt.Errorf("%w: bad -iters %v (want a factor above 0)", errUsage, f.scale)
	}
	if f.device < 0 {
		return nil, fmt.Errorf("%w: bad -device %d (want a device ordinal, 0 or more)", errUsage, f.device)
	}
	if f.count < 1 {
		return nil, fmt.Errorf("%w: bad -count %d (want 1 or more)", errUsage, f.count)
	}
	if *asJSON {
		if f.format != "table" && f.format != "json" {
			return nil, fmt.Errorf("%w: -json and -format %s contradict each other", errUsage, f.format)
		}
		f.format = "json"
	}
	switch f.format {
	case "table", "benchstat", "json":
	default:
		return nil, fmt.Errorf("%w: unknown -format %q (want table, benchstat or json)", errUsage, f.format)
	}
	if f.cpuProf == "-" {
		return nil, fmt.Errorf("%w: -cpuprofile - would mix a binary profile into the output (want a file name)", errUsage)
	}
	if f.log == "-" {
		return nil, fmt.Errorf("%w: -log - would mix the log into the %s output on standard output (want a file name)", errUsage, f.format)
	}
	if f.svg == "-" {
		return nil, fmt.Errorf("%w: -svg - would mix the chart into the %s output on standard output (want a file name)", errUsage, f.format)
	}
	if f.growTo < minGrowTo || f.growTo%vmmStep != 0 {
		return nil, fmt.Errorf("%w: bad -grow-to %s (want a multiple of %s, at least %s)", errUsage, sizeLabel(f.growTo), sizeLabel(vmmStep), sizeLabel(minGrowTo))
	}
	if grow := growStepName(f.growTo); setFlags(fs)["grow-to"] && !strings.HasPrefix(grow, f.only) {
		return nil, fmt.Errorf("%w: -grow-to sets the size of %s, which -only %q leaves out", errUsage, grow, f.only)
	}
	if f.maxCopy < 4<<10 || f.maxCopy > 16<<30 {
		return nil, fmt.Errorf("%w: bad -max-copy %s (want 4KiB to 16GiB)", errUsage, sizeLabel(f.maxCopy))
	}
	if _, err := parseStagingSpec(f.staging, staging.Current()); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := checkFiles([]namedFile{{"-cgo", f.baseline}}, []namedFile{{"-svg", f.svg}, {"-cpuprofile", f.cpuProf}, {"-log", f.log}}); err != nil {
		return nil, err
	}
	return f, nil
}

func runBench(args []string, stdout, stderr io.Writer) (err error) {
	if len(args) > 0 && args[0] == ipcChildArg {
		// The child side of ipc/child_import (hidden: bench re-executes
		// this binary with it).
		return runIPCChild(stdout)
	}
	f, err := parseBenchFlags(args, stderr)
	if err != nil {
		return err
	}
	if f.lock {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	// The chart's file is opened before the measurements run, so a name
	// that cannot be written fails at once; and the chart, which draws
	// the ratios to the C baseline, needs the baseline program.
	var svg *outFile
	if f.svg != "" {
		if svg, err = openOut("-svg", f.svg, stdout); err != nil {
			return err
		}
		defer svg.discard()
		if _, err := baselinePath(f); err != nil {
			return fmt.Errorf("-svg draws the ratios to the C baseline, and there is none: %w", err)
		}
	}
	var prof *outFile
	if f.cpuProf != "" {
		if prof, err = openOut("-cpuprofile", f.cpuProf, stdout); err != nil {
			return err
		}
		defer prof.discard()
	}
	if f.log != "" {
		lf, err := os.OpenFile(f.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o666)
		if err != nil {
			return fmt.Errorf("-log: %w", err)
		}
		defer lf.Close()
		resultLog = json.NewEncoder(lf)
		defer func() { resultLog = nil }()
	}
	dev, err := deviceFlag(f.device)
	if err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defaults := staging.Current()
	params, err := parseStagingSpec(f.staging, defaults)
	if err != nil {
		return err
	}
	env := &benchEnv{dev: dev, stream: s, growTo: f.growTo, stderr: stderr, staging: params}
	env.host = &hostBufs{e: env, max: f.maxCopy}
	env.cleanup = append(env.cleanup, s.Close)
	defer func() { err = errors.Join(err, env.close()) }()
	// The staging parameters in force for the run, and the defaults after it.
	if err := staging.Set(params); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, staging.Set(defaults)) }()
	fmt.Fprintf(stderr, "bench: staging %v; %s\n", params, hostNotes())

	all, err := measurements(env)
	if err != nil {
		return err
	}
	var ms []measurement
	for _, m := range all {
		if strings.HasPrefix(m.name, f.only) {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		return fmt.Errorf("%w: no measurement name starts with %q", errUsage, f.only)
	}
	var profile bytes.Buffer
	if prof != nil {
		if err := pprof.StartCPUProfile(&profile); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
	}
	names := baselineNames(ms)
	var pr *pairer
	if _, err := baselinePath(f); err == nil && f.alternate && len(names) > 0 {
		srv, err := startBaseline(f, names, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "bench: the C baseline cannot alternate with ours (%v); it runs after ours\n", err)
		} else {
			pr = &pairer{srv: srv, reps: map[string]int{}}
		}
	}
	ours, _ := runOurs(ms, f.scale, f.count, stderr, pr) // failures are in ours, marked
	if prof != nil {
		pprof.StopCPUProfile()
		if err := prof.write(func(w io.Writer) error { _, err := w.Write(profile.Bytes()); return err }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "bench: wrote %s\n", prof.name)
	}
	var base []result
	var baseErr error
	switch {
	case pr != nil:
		base, baseErr = pr.base, pr.err
		if pr.srv != nil {
			if err := pr.srv.close(); err != nil {
				baseErr = err
			}
		}
	case len(names) > 0:
		base, baseErr = runBaseline(f, names, stderr)
	}
	return report(f.format, svg, ms, ours, base, baseErr, stdout, stderr)
}

// report prints what bench measured in format (and the chart to svg,
// when not nil): every figure there is, failed measurements marked as
// such. It returns an error naming the measurements that failed.
func report(format string, svg *outFile, ms []measurement, ours, base []result, baseErr error, stdout, stderr io.Writer) error {
	switch format {
	case "json":
		enc := json.NewEncoder(stdout)
		for _, r := range append(slices.Clip(ours), base...) {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	case "benchstat":
		if err := printBenchstat(stdout, append(slices.Clip(ours), base...)); err != nil {
			return err
		}
	default:
		printBench(stdout, ms, ours, base)
	}
	switch {
	case baseErr != nil && len(base) == 0:
		fmt.Fprintf(stderr, "cudamem bench: no C baseline: %v\n", baseErr)
	case baseErr != nil:
		fmt.Fprintf(stderr, "cudamem bench: the C baseline stopped early (its figures so far are shown): %v\n", baseErr)
	}
	var chartErr error
	if svg != nil {
		// A chart of ratios with no ratio in it says nothing: not drawn.
		if rows := ratioRows(ms, ours, base); !slices.ContainsFunc(rows, charted) {
			svg.discard()
			chartErr = fmt.Errorf("-svg %s not written: no measurement has both a figure of its own and a C baseline figure to compare it with", svg.name)
		} else if err := svg.write(func(w io.Writer) error { return writeSVG(w, rows) }); err != nil {
			chartErr = err
		} else {
			fmt.Fprintf(stderr, "bench: wrote %s\n", svg.name)
		}
	}
	return errors.Join(chartErr, failures(ms, ours))
}

// failures returns an error listing the measurements that failed, or nil.
func failures(ms []measurement, ours []result) error {
	var failed []string
	for _, r := range ours {
		if r.Error != "" {
			failed = append(failed, r.Name+": "+r.Error)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d measurements failed (marked FAILED; the others' results are shown):\n  %s",
		len(failed), len(ms), strings.Join(failed, "\n  "))
}

// runOurs runs each measurement count times after a warm-up, reporting
// progress on stderr. A measurement that fails is reported there, marked
// in the results (one result with Error set) and in the returned error,
// and the next one runs: one failure does not lose the others' figures.
//
// Every selected measurement's setup runs first, before any is timed, as
// the C baseline sets up everything its selection needs before its first
// measurement: the state a setup leaves matters to others. (An IPC pool
// that stays alive, as ipc/child_import's does, makes every later pool
// create + export + destroy about six times faster, in C as in Go; set up
// lazily, ours ran without it and C's with it.)
//
// With p, each repetition is paired with one of its baseline's (see
// benchpair.go), whose figures p keeps.
func runOurs(ms []measurement, scale float64, count int, stderr io.Writer, p *pairer) ([]result, error) {
	var ours []result
	var errs []error
	setupErr := make([]error, len(ms))
	for i := range ms {
		if m := &ms[i]; m.setup != nil && m.skip == "" {
			setupErr[i] = m.setup()
			m.setup = nil
		}
	}
	for i, m := range ms {
		var skip *skipError
		if err := setupErr[i]; errors.As(err, &skip) {
			fmt.Fprintf(stderr, "bench: skipped %s: %s\n", m.name, skip.reason)
			continue
		} else if err != nil {
			fmt.Fprintf(stderr, "bench: FAILED %s: setup: %v\n", m.name, err)
			ours = append(ours, result{Name: m.name, Error: "setup: " + err.Error()})
			errs = append(errs, fmt.Errorf("%s: setup: %w", m.name, err))
			continue
		}
		n := max(1, int(float64(m.iters)*scale))
		fmt.Fprintf(stderr, "bench: [%d/%d] %s (%d × %d iterations)\n", i+1, len(ms), m.name, count, n)
		rs, err := runOne(&m, n, count, p)
		switch {
		case errors.As(err, &skip):
			fmt.Fprintf(stderr, "bench: skipped %s: %s\n", m.name, skip.reason)
			continue
		case err != nil:
			fmt.Fprintf(stderr, "bench: FAILED %s: %v\n", m.name, err)
			ours = append(ours, result{Name: m.name, Error: err.Error()})
			logResults(ours[len(ours)-1:])
			errs = append(errs, fmt.Errorf("%s: %w", m.name, err))
			continue
		}
		ours = append(ours, rs...)
		logResults(rs)
		if p != nil {
			logResults(p.base[p.logged:])
			p.logged = len(p.base)
		}
	}
	return ours, errors.Join(errs...)
}

func runOne(m *measurement, n, count int, p *pairer) ([]result, error) {
	if m.skip != "" {
		return nil, &skipError{reason: m.skip}
	}
	if m.setup != nil {
		if err := m.setup(); err != nil {
			return nil, err
		}
	}
	if _, err := m.run(max(1, n/10)); err != nil { // warm up
		return nil, err
	}
	var rs []result
	ops := m.ops(n)
	for rep := 1; rep <= count; rep++ {
		// Paired with a baseline repetition: first ours, then the
		// baseline's, then the other way round, so that neither always
		// runs in the other's wake.
		var base map[string]result
		if rep%2 == 0 {
			base = p.once(m.baseline)
		}
		d, err := m.run(n)
		if err != nil {
			return nil, err
		}
		if rep%2 == 1 {
			base = p.once(m.baseline)
		}
		r := result{Name: m.name, NsPerOp: float64(d.Nanoseconds()) / float64(ops), Iters: ops, Rep: rep}
		if m.bytes > 0 {
			r.GBps = float64(m.bytes) / (float64(d.Nanoseconds()) / float64(n))
		}
		if m.extra != nil {
			r.Extra = m.extra()
		}
		r.Pair = pairRatio(r, base, m.baseline)
		rs = append(rs, r)
		for _, s := range m.sides {
			sr := result{Name: s.name, NsPerOp: float64(s.d.Nanoseconds()) / float64(ops), Iters: ops, Rep: rep}
			sr.Pair = pairRatio(sr, base, s.baseline)
			rs = append(rs, sr)
		}
	}
	return rs, nil
}

// resultLog, when -log is given, receives every figure as it is made.
var resultLog *json.Encoder

// logResults appends rs to the -log file, if any. A write that fails
// stops the log, not the run.
func logResults(rs []result) {
	if resultLog == nil {
		return
	}
	for _, r := range rs {
		if resultLog.Encode(r) != nil {
			resultLog = nil
			return
		}
	}
}

// baselineNames lists the baseline measurements ms are compared with, once each.
func baselineNames(ms []measurement) []string {
	seen := map[string]bool{}
	var names []string
	add := func(n string) {
		if n != "" && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	for _, m := range ms {
		add(m.baseline)
		for _, s := range m.sides {
			add(s.baseline)
		}
	}
	return names
}

// runBaseline runs the C baseline program for the given measurements and
// reads its JSON lines. Its progress lines go on to stderr.
func runBaseline(f *benchFlags, names []string, stderr io.Writer) ([]result, error) {
	path, err := baselinePath(f)
	if err != nil {
		return nil, err
	}
	var tail tailBuffer
	cmd := exec.Command(path, baselineArgs(f, names)...)
	cmd.Stderr = io.MultiWriter(stderr, &tail)
	out, err := cmd.Output()
	if err != nil {
		// Keep what it measured before it failed.
		res, _ := parseResults(path, out)
		if msg := strings.TrimSpace(tail.String()); msg != "" {
			return res, fmt.Errorf("%s: %w: %s", path, err, msg)
		}
		return res, fmt.Errorf("%s: %w", path, err)
	}
	return parseResults(path, out)
}

// baselinePath is the C baseline program's path: -cgo's, or cgo-baseline
// beside this binary, which must exist.
func baselinePath(f *benchFlags) (string, error) {
	if f.baseline != "" {
		return f.baseline, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(exe), "cgo-baseline")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s not found: build it in a clone of the repository with "+
			"'CGO_ENABLED=1 go build -o cgo-baseline ./testdata/cgobench' (needs a C compiler, no CUDA toolkit) "+
			"and put it beside this binary, or pass -cgo PATH", path)
	}
	return path, nil
}

// baselineArgs is the baseline program's command line for f and names.
func baselineArgs(f *benchFlags, names []string) []string {
	return []string{
		"-device", fmt.Sprint(f.device),
		"-iters", fmt.Sprint(f.scale),
		"-count", fmt.Sprint(f.count),
		"-grow-to", fmt.Sprint(f.growTo),
		"-names", strings.Join(names, ","),
	}
}

// parseResults reads the baseline's JSON lines. On a line that is not a
// result it returns the results before it with the error.
func parseResults(path string, out []byte) ([]result, error) {
	var res []result
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return res, fmt.Errorf("%s printed %q: %w", path, sc.Text(), err)
		}
		res = append(res, r)
	}
	if len(res) == 0 {
		return nil, errors.New(path + " printed no results")
	}
	return res, nil
}

// tailBuffer keeps the last 4 KiB written to it, for error messages.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	const keep = 4 << 10
	t.b = append(t.b, p...)
	if len(t.b) > keep {
		t.b = append(t.b[:0], t.b[len(t.b)-keep:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

func sizeLabel(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func timed(n int, s *cuda.Stream, f func() error) (time.Duration, error) {
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := f(); err != nil {
			return 0, err
		}
	}
	if s != nil {
		if err := s.Sync(); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// measurements lists what bench measures. Each uses the same driver calls
// as the baseline it is compared with.
func measurements(e *benchEnv) ([]measurement, error) {
	ms := []measurement{{
		name: "trivial/go", baseline: "trivial/cgo", iters: 1_000_000,
		run: func(n int) (time.Duration, error) {
			return timed(n, nil, func() error { _, err := cuda.DriverVersion(); return err })
		},
	}}
	pool, err := e.dev.DefaultMemPool()
	if err != nil {
		return nil, err
	}
	if err := pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, ^uint64(0)); err != nil {
		return nil, err
	}
	for _, size := range []uint64{256, 1 << 20, 64 << 20} {
		ms = append(ms, measurement{
			name: "poolpair/go/" + sizeLabel(size), baseline: "poolpair/cgo/" + sizeLabel(size), iters: 200_000,
			run: func(n int) (time.Duration, error) {
				return timed(n, e.stream, func() error {
					p, err := e.stream.MemAllocFromPoolAsync(pool, size)
					if err != nil {
						return err
					}
					return e.stream.MemFreeAsync(p)
				})
			},
		})
	}
	ms = append(ms, extraMeasurements(e)...)
	ms = append(ms, copyMeasurements(e)...)
	ms = append(ms, ipcMeasurements(e)...)
	ms = append(ms, vmmMeasurements(e)...)
	ms = append(ms, mtMeasurements(e)...)
	ms = append(ms, batchMeasurements(e)...)
	ms = append(ms, hostCopyMeasurements(e)...)
	ms = append(ms, sweepMeasurements(e)...)
	ms = append(ms, ceilingMeasurements(e)...)
	return ms, nil
}

const copyBytes = 256 << 20

// copyMeasurements times the raw driver copies; their buffers are made
// only when one of them is selected.
func copyMeasurements(e *benchEnv) []measurement {
	d, s := e.dev, e.stream
	var host unsafe.Pointer
	var a, b cuda.DevicePtr
	ready := false
	setup := func() error {
		if ready {
			return nil
		}
		h, err := d.MemHostAlloc(copyBytes, cuda.MemHostAllocPortable)
		if err != nil {
			return err
		}
		host = h
		e.cleanup = append(e.cleanup, func() error { return d.MemFreeHost(h) })
		if a, err = d.MemAlloc(copyBytes); err != nil {
			return err
		}
		pa := a
		e.cleanup = append(e.cleanup, func() error { return d.MemFree(pa) })
		if b, err = d.MemAlloc(copyBytes); err != nil {
			return err
		}
		pb := b
		e.cleanup = append(e.cleanup, func() error { return d.MemFree(pb) })
		ready = true
		return nil
	}
	return []measurement{
		{name: "copy/htod_pinned/go", baseline: "copy/htod_pinned", iters: 20, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemcpyHtoDAsync(a, host, copyBytes) })
			}},
		{name: "copy/dtoh_pinned/go", baseline: "copy/dtoh_pinned", iters: 20, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemcpyDtoHAsync(host, a, copyBytes) })
			}},
		{name: "copy/dtod/go", baseline: "copy/dtod", iters: 80, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemcpyAsync(b, a, copyBytes) })
			}},
		{name: "fill/d32/go", baseline: "fill/d32", iters: 80, bytes: copyBytes, setup: setup,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemsetD32Async(a, 0x01020304, copyBytes/4) })
			}},
	}
}
