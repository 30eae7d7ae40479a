package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cudamem/cudamem/cuda"
)

// result is one measurement; the C baseline program prints the same shape.
type result struct {
	Name    string  `json:"name"`
	NsPerOp float64 `json:"ns_per_op"`
	GBps    float64 `json:"gbps,omitempty"`
	Iters   int     `json:"iters"`
}

// measurement is one benchmark of ours and the baseline it is compared to.
type measurement struct {
	name     string // ours, e.g. "poolpair/go/1MiB"
	baseline string // the C program's name, e.g. "poolpair/cgo/1MiB"
	iters    int
	bytes    uint64 // per iteration, for GB/s; 0 for latency measurements
	// run performs n iterations and returns the time they took.
	run func(n int) (time.Duration, error)
}

type benchEnv struct {
	dev     *cuda.Device
	stream  *cuda.Stream
	cleanup []func() error
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

func runBench(args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	device := fs.Int("device", 0, "device `ordinal`")
	only := fs.String("only", "", "run only measurements whose name starts with `PREFIX`")
	scale := fs.Float64("iters", 1, "multiply iteration counts by `X`")
	baseline := fs.String("cgo", "", "`path` of the C baseline program (testdata/cgobench); default: cgo-baseline beside this binary, if present")
	asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
	lock := fs.Bool("lock", false, "lock the benchmarking goroutine to one OS thread (as the C baseline is); cudamem never needs it, this shows what thread affinity is worth")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *scale <= 0 {
		return fmt.Errorf("%w: bad bench arguments %q (iters %v)", errUsage, fs.Args(), *scale)
	}
	if *lock {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	dev, err := cuda.GetDevice(*device)
	if err != nil {
		return describeLoadError(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	env := &benchEnv{dev: dev, stream: s}
	env.cleanup = append(env.cleanup, s.Close)
	defer func() { err = errors.Join(err, env.close()) }()

	ms, err := measurements(env)
	if err != nil {
		return err
	}
	var ours []result
	for _, m := range ms {
		if !strings.HasPrefix(m.name, *only) {
			continue
		}
		n := max(1, int(float64(m.iters)**scale))
		if _, err := m.run(max(1, n/10)); err != nil { // warm up
			return fmt.Errorf("%s: %w", m.name, err)
		}
		d, err := m.run(n)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		r := result{Name: m.name, NsPerOp: float64(d.Nanoseconds()) / float64(n), Iters: n}
		if m.bytes > 0 {
			r.GBps = float64(m.bytes) / r.NsPerOp
		}
		ours = append(ours, r)
	}
	base, baseErr := runBaseline(*baseline, *device, *scale)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range append(ours, sortedResults(base)...) {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	} else {
		printBench(stdout, ms, ours, base)
	}
	if baseErr != nil {
		fmt.Fprintf(stderr, "cudamem bench: no C baseline: %v\n", baseErr)
	}
	return nil
}

func sortedResults(m map[string]result) []result {
	out := make([]result, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// runBaseline runs the C baseline program and reads its JSON lines.
func runBaseline(path string, device int, scale float64) (map[string]result, error) {
	if path == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		path = filepath.Join(filepath.Dir(exe), "cgo-baseline")
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("%s not found (build it with ../shared/tools/gpu-pack --cgo-bench testdata/cgobench, or pass -cgo)", path)
		}
	}
	var stderr bytes.Buffer
	cmd := exec.Command(path, "-device", fmt.Sprint(device), "-iters", fmt.Sprint(scale))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", path, err, strings.TrimSpace(stderr.String()))
	}
	res := map[string]result{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s printed %q: %w", path, sc.Text(), err)
		}
		res[r.Name] = r
	}
	if len(res) == 0 {
		return nil, errors.New(path + " printed no results")
	}
	return res, nil
}

func printBench(w io.Writer, ms []measurement, ours []result, base map[string]result) {
	baseOf := map[string]string{}
	for _, m := range ms {
		baseOf[m.name] = m.baseline
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measurement\tcudamem\tbaseline\tC baseline\tratio (time, cudamem/baseline)")
	for _, r := range ours {
		b, ok := base[baseOf[r.Name]]
		cell := func(r result) string {
			if r.GBps > 0 {
				return fmt.Sprintf("%.1f GB/s", r.GBps)
			}
			return fmt.Sprintf("%.1f ns/op", r.NsPerOp)
		}
		if !ok {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\n", r.Name, cell(r), baseOf[r.Name])
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2fx\n", r.Name, cell(r), b.Name, cell(b), r.NsPerOp/b.NsPerOp)
	}
	tw.Flush()
}

func sizeLabel(n uint64) string {
	switch {
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
	cm, err := copyMeasurements(e)
	if err != nil {
		return nil, err
	}
	return append(ms, cm...), nil
}

const copyBytes = 256 << 20

func copyMeasurements(e *benchEnv) ([]measurement, error) {
	d, s := e.dev, e.stream
	host, err := d.MemHostAlloc(copyBytes, cuda.MemHostAllocPortable)
	if err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, func() error { return d.MemFreeHost(host) })
	a, err := d.MemAlloc(copyBytes)
	if err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, func() error { return d.MemFree(a) })
	b, err := d.MemAlloc(copyBytes)
	if err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, func() error { return d.MemFree(b) })
	return []measurement{
		{name: "copy/htod_pinned/go", baseline: "copy/htod_pinned", iters: 20, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemcpyHtoDAsync(a, host, copyBytes) })
			}},
		{name: "copy/dtoh_pinned/go", baseline: "copy/dtoh_pinned", iters: 20, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemcpyDtoHAsync(host, a, copyBytes) })
			}},
		{name: "copy/dtod/go", baseline: "copy/dtod", iters: 80, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemcpyAsync(b, a, copyBytes) })
			}},
		{name: "fill/d32/go", baseline: "fill/d32", iters: 80, bytes: copyBytes,
			run: func(n int) (time.Duration, error) {
				return timed(n, s, func() error { return s.MemsetD32Async(a, 0x01020304, copyBytes/4) })
			}},
	}, nil
}
