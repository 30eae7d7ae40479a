package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/staging"
	"github.com/cudamem/cudamem/resource"
)

// The host-copy measurements: copies between ordinary Go memory and the
// device through package buffer, by size and way.
//
//   - hostcopy/{htod,dtoh}/{driver,staged,pinned}/SIZE, SIZE from 4 KiB to
//     -max-copy in powers of 4: the driver's own pageable copy (staging
//     off), the staged copy (staging forced on, whatever the size), and
//     the pinned copy of the same size (the bus). dtoh also has
//     driver_fresh and staged_fresh: the destination's pages released
//     (madvise MADV_DONTNEED, untimed) before every copy, so each copy
//     pays the first touch of fresh memory, as a new slice does.
//     The table prints them by size, with the crossover where staging
//     starts to pay in each way.
//   - staging/dtoh/SIZE/{fresh,reused}/CONFIG: the staged copy out of the
//     device under other staging parameters (workers, pool shape,
//     prefault, eager refill), at 64 MiB and 1 GiB; "before-..." is the
//     parameters of the previous release, "default-..." those in force. The
//     table gives each with where its time went (internal/staging's
//     counters and the minor page faults) and the best of each size.
const (
	hostCopyPrefix = "hostcopy/"
	sweepPrefix    = "staging/"
	defaultMaxCopy = 1 << 30
)

// hostCopySizes are the sizes of the hostcopy family up to max.
func hostCopySizes(max uint64) []uint64 {
	var s []uint64
	for n := uint64(4 << 10); n <= max; n *= 4 {
		s = append(s, n)
	}
	return s
}

// hostIters is how many copies of n bytes one repetition makes: about
// 256 MiB, between 2 and 2,000 copies.
func hostIters(n uint64) int {
	return int(min(2000, max(2, (256<<20)/n)))
}

// hostBufs are the host-copy measurements' memory, made once for all of
// them: a device buffer, pinned memory and two slices of ordinary memory
// of the largest size (one kept mapped, one whose pages each fresh copy
// releases, and another such for huge pages), mapped outside the Go heap
// (see hostMemory).
type hostBufs struct {
	e      *benchEnv
	max    uint64
	ready  bool
	err    error
	dev    *buffer.Buffer
	views  map[uint64]*buffer.Buffer
	pinned unsafe.Pointer
	page   []byte // mapped: written once at setup
	fresh  []byte // pages released before every copy
	// freshHuge is fresh for the staging parameters that ask for huge
	// pages: the advice stays with the mapping, and would give every
	// later fresh copy huge pages it did not ask for.
	freshHuge []byte
}

// freshFor is the fresh destination for copies under p.
func (h *hostBufs) freshFor(p staging.Params) []byte {
	if p.HugePages {
		return h.freshHuge
	}
	return h.fresh
}

func (h *hostBufs) setup() error {
	if h.ready {
		return h.err
	}
	h.ready = true
	h.err = h.make()
	return h.err
}

func (h *hostBufs) make() error {
	e := h.e
	if free, _, err := e.dev.MemInfo(); err == nil && free < h.max+(1<<30) {
		return skipf("%s of device memory free, these measurements need %s and 1 GiB to spare", sizeLabel(free), sizeLabel(h.max))
	}
	pool, err := resource.CurrentDevicePool(e.dev)
	if err != nil {
		return err
	}
	if h.dev, err = buffer.Allocate(pool, h.max, e.stream); err != nil {
		return err
	}
	e.cleanup = append(e.cleanup, h.dev.Close)
	if err := h.dev.Fill8(7, e.stream); err != nil {
		return err
	}
	h.views = map[uint64]*buffer.Buffer{}
	for _, n := range append(hostCopySizes(h.max), sweepSizes(h.max)...) {
		if h.views[n] == nil {
			if h.views[n], err = h.dev.Slice(0, n); err != nil {
				return err
			}
		}
	}
	p, err := e.dev.MemHostAlloc(h.max, cuda.MemHostAllocPortable)
	if err != nil {
		return err
	}
	h.pinned = p
	e.cleanup = append(e.cleanup, func() error { return e.dev.MemFreeHost(p) })
	for _, m := range []*[]byte{&h.page, &h.fresh, &h.freshHuge} {
		b, free, err := hostMemory(h.max)
		if err != nil {
			return err
		}
		e.cleanup = append(e.cleanup, free)
		*m = b
	}
	for i := range h.page {
		h.page[i] = byte(i)
	}
	return e.stream.Sync()
}

// loop makes n copies and returns their time; with fresh set, fresh's
// pages are released before each (untimed).
func (h *hostBufs) loop(n int, fresh []byte, copy func() error) (time.Duration, error) {
	if fresh == nil {
		return timed(n, h.e.stream, copy)
	}
	var total time.Duration
	for range n {
		if !releasePages(fresh) {
			return 0, skipf("cannot release pages here (madvise MADV_DONTNEED is Linux's)")
		}
		t := time.Now()
		if err := copy(); err != nil {
			return 0, err
		}
		total += time.Since(t)
	}
	return total, nil
}

// probe records, per repetition, where a staged copy's time went: the
// counters of internal/staging and the minor page faults.
type probe struct {
	last map[string]float64
}

// run times n copies by f with the counters on and keeps their figures.
func (p *probe) run(n int, f func(n int) (time.Duration, error)) (time.Duration, error) {
	staging.Profile.Store(true)
	defer staging.Profile.Store(false)
	s0, f0 := staging.Read(), minorFaults()
	d, err := f(n)
	s, faults := staging.Read().Sub(s0), minorFaults()-f0
	p.last = nil
	if err != nil {
		return d, err
	}
	per := func(v int64, by int64) float64 {
		if by <= 0 {
			return 0
		}
		return float64(v) / float64(by) / 1e6 // ms
	}
	p.last = map[string]float64{
		"staged":      float64(s.Copies) / float64(n),
		"wait_ms":     per(s.WaitNs, s.Copies),
		"move_ms":     per(s.MoveNs, s.Workers),
		"prefault_ms": per(s.PrefaultNs, s.Workers),
		"idle_ms":     per(s.IdleNs, s.Workers),
		"workers":     float64(s.Workers) / float64(max(1, s.Copies)),
	}
	if f0 >= 0 {
		p.last["minflt"] = float64(faults) / float64(n)
	}
	return d, nil
}

func (p *probe) extra() map[string]float64 { return p.last }

// withMin returns params with min as every threshold.
func withMin(p staging.Params, min int) staging.Params {
	p.MinBytes, p.OutMinBytes, p.FreshMinBytes = min, min, min
	return p
}

// useStaging puts p in force (if it is not).
func useStaging(p staging.Params) error {
	if staging.Current() == p {
		return nil
	}
	return staging.Set(p)
}

func hostCopyMeasurements(e *benchEnv) []measurement {
	h := e.host
	s := e.stream
	var ms []measurement
	driver := withMin(e.staging, math.MaxInt)
	staged := withMin(e.staging, 0)
	for _, dir := range []string{"htod", "dtoh"} {
		for _, n := range hostCopySizes(h.max) {
			variants := []string{"driver", "staged", "pinned"}
			if dir == "dtoh" {
				variants = append(variants, "driver_fresh", "staged_fresh")
			}
			for _, v := range variants {
				m := measurement{name: fmt.Sprintf("%s%s/%s/%s", hostCopyPrefix, dir, v, sizeLabel(n)), iters: hostIters(n), bytes: n, setup: h.setup}
				pr := &probe{}
				params := driver
				if strings.HasPrefix(v, "staged") {
					params = staged
					m.extra = pr.extra
				}
				m.run = func(iters int) (time.Duration, error) {
					if err := useStaging(params); err != nil {
						return 0, err
					}
					view := h.views[n]
					var fresh []byte
					dst := h.page[:n]
					if strings.HasSuffix(v, "_fresh") {
						fresh = h.freshFor(params)[:n]
						dst = fresh
					}
					var f func() error
					switch {
					case v == "pinned" && dir == "htod":
						f = func() error { return s.MemcpyHtoDAsync(view.Ptr(), h.pinned, n) }
					case v == "pinned":
						f = func() error { return s.MemcpyDtoHAsync(h.pinned, view.Ptr(), n) }
					case dir == "htod":
						f = func() error { return buffer.CopyFromHost(view, h.page[:n], s) }
					default:
						f = func() error { return buffer.CopyToHost(dst, view, s) }
					}
					if m.extra == nil {
						return h.loop(iters, fresh, f)
					}
					return pr.run(iters, func(iters int) (time.Duration, error) { return h.loop(iters, fresh, f) })
				}
				ms = append(ms, m)
			}
		}
	}
	return ms
}

// sweepSizes are the staging sweep's sizes up to max.
func sweepSizes(max uint64) []uint64 {
	var s []uint64
	for _, n := range []uint64{64 << 20, 1 << 30} {
		if n > max {
			n = max
		}
		if !slices.Contains(s, n) {
			s = append(s, n)
		}
	}
	return s
}

// sweepConfig is one point of the staging sweep.
type sweepConfig struct {
	name string
	p    staging.Params
}

// configName names p by how it differs from nothing: wW-KxSIZE-PREFAULT
// with -lazy when not eager, -huge for huge pages, -aheadN and -freshN
// (workers into fresh memory).
func configName(p staging.Params) string {
	s := fmt.Sprintf("w%d-%dx%s-%v", p.OutWorkers, p.Chunks, sizeLabel(uint64(p.ChunkSize)), p.Prefault)
	if !p.Eager {
		s += "-lazy"
	}
	if p.HugePages {
		s += "-huge"
	}
	if p.Ahead > 0 {
		s += fmt.Sprintf("-ahead%d", p.Ahead)
	}
	if p.FreshWorkers > 0 {
		s += fmt.Sprintf("-fresh%d", p.FreshWorkers)
	}
	return s
}

// beforeParams are the staging parameters of the previous release: eight
// workers both ways, four chunks of 8 MiB, no prefault, no eager refill.
func beforeParams(min int) staging.Params {
	return staging.Params{MinBytes: min, OutMinBytes: min, FreshMinBytes: min, ChunkSize: 8 << 20, Chunks: 4, InWorkers: 8, OutWorkers: 8, Prefault: staging.PrefaultOff}
}

// sweepConfigs lists the sweep's points: the previous release's and the
// defaults in force first, then workers × pool shape × prefault (eager),
// then single changes of the defaults. reused says which of them run on
// a mapped destination (fewer: that case is not the one to tune).
func sweepConfigs(def staging.Params, reused bool) []sweepConfig {
	cs := []sweepConfig{{"before-" + configName(beforeParams(0)), beforeParams(0)}, {"default-" + configName(def), withMin(def, 0)}}
	seen := map[staging.Params]bool{cs[0].p: true, cs[1].p: true}
	add := func(p staging.Params) {
		p.MinBytes, p.OutMinBytes = 0, 0
		p.FreshWorkers = 0 // the workers are the point's own, fresh or not
		if p.Prefault != staging.PrefaultPopulate {
			p.Ahead = 0 // goroutines ahead only populate
		}
		if !seen[p] {
			seen[p] = true
			cs = append(cs, sweepConfig{configName(p), p})
		}
	}
	base := withMin(def, 0)
	for _, w := range []int{4, 8, 12, 16} {
		p := base
		p.OutWorkers = w
		add(p)
	}
	if reused {
		return cs
	}
	for _, pf := range []staging.Prefault{staging.PrefaultOff, staging.PrefaultPopulate} {
		for _, shape := range [][2]int{{4, 8 << 20}, {8, 8 << 20}, {4, 16 << 20}, {4, 32 << 20}, {8, 4 << 20}, {16, 4 << 20}} {
			for _, w := range []int{4, 8, 12, 16} {
				p := base
				p.Chunks, p.ChunkSize, p.OutWorkers, p.Prefault, p.Eager = shape[0], shape[1], w, pf, true
				add(p)
			}
		}
	}
	// Pages mapped by goroutines of their own, ahead of the workers.
	for _, w := range []int{8, 12} {
		for _, ahead := range []int{2, 4, 8} {
			p := base
			p.OutWorkers, p.Prefault, p.Ahead, p.Eager = w, staging.PrefaultPopulate, ahead, true
			add(p)
		}
	}
	for _, f := range []func(*staging.Params){
		func(p *staging.Params) {
			p.OutWorkers, p.Prefault, p.Ahead, p.HugePages = 12, staging.PrefaultPopulate, 4, true
		},
		func(p *staging.Params) { p.OutWorkers, p.Prefault, p.HugePages = 16, staging.PrefaultPopulate, true },
		func(p *staging.Params) { p.Prefault = staging.PrefaultTouch; p.Ahead = 0 },
		func(p *staging.Params) { p.Eager = !p.Eager },
		func(p *staging.Params) { p.HugePages = true },
	} {
		p := base
		f(&p)
		add(p)
	}
	return cs
}

func sweepMeasurements(e *benchEnv) []measurement {
	h := e.host
	var ms []measurement
	for _, n := range sweepSizes(h.max) {
		for _, mode := range []string{"fresh", "reused"} {
			for _, c := range sweepConfigs(e.staging, mode == "reused") {
				pr := &probe{}
				p := c.p
				ms = append(ms, measurement{
					name:  fmt.Sprintf("%sdtoh/%s/%s/%s", sweepPrefix, sizeLabel(n), mode, c.name),
					iters: hostIters(n), bytes: n, setup: h.setup, extra: pr.extra,
					run: func(iters int) (time.Duration, error) {
						if err := useStaging(p); err != nil {
							return 0, err
						}
						var fresh []byte
						dst := h.page[:n]
						if mode == "fresh" {
							fresh = h.freshFor(p)[:n]
							dst = fresh
						}
						view := h.views[n]
						return pr.run(iters, func(iters int) (time.Duration, error) {
							return h.loop(iters, fresh, func() error { return buffer.CopyToHost(dst, view, e.stream) })
						})
					},
				})
			}
		}
	}
	return ms
}

// sweepKey parses "staging/dtoh/1GiB/fresh/w8-..." into its parts.
func sweepKey(name string) (size, mode, config string, ok bool) {
	rest, ok := strings.CutPrefix(name, sweepPrefix+"dtoh/")
	if !ok {
		return "", "", "", false
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// hostKey parses "hostcopy/dtoh/staged/4KiB".
func hostKey(name string) (dir, variant, size string, ok bool) {
	rest, ok := strings.CutPrefix(name, hostCopyPrefix)
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// extraMedians is the median of each extra figure over s's repetitions.
func extraMedians(rs []result) map[string]map[string]float64 {
	by := map[string]map[string][]float64{}
	for _, r := range rs {
		for k, v := range r.Extra {
			if by[r.Name] == nil {
				by[r.Name] = map[string][]float64{}
			}
			by[r.Name][k] = append(by[r.Name][k], v)
		}
	}
	out := map[string]map[string]float64{}
	for name, m := range by {
		out[name] = map[string]float64{}
		for k, vs := range m {
			out[name][k] = median(vs)
		}
	}
	return out
}

// printHostCopies prints the hostcopy family as a markdown table (GB/s,
// medians) and the crossovers where staging starts to pay.
func printHostCopies(w io.Writer, ours []result) {
	sums := map[string]summary{}
	var sizes []string
	for _, s := range summarize(ours) {
		_, _, size, ok := hostKey(s.Name)
		if !ok {
			continue
		}
		sums[s.Name] = s
		if !slices.Contains(sizes, size) {
			sizes = append(sizes, size)
		}
	}
	if len(sums) == 0 {
		return
	}
	slices.SortStableFunc(sizes, func(a, b string) int { return cmp.Compare(mustSize(a), mustSize(b)) })
	cols := []struct{ dir, variant, head string }{
		{"htod", "driver", "Go → device, driver"}, {"htod", "staged", "staged"}, {"htod", "pinned", "pinned"},
		{"dtoh", "driver", "device → Go, driver"}, {"dtoh", "staged", "staged"}, {"dtoh", "pinned", "pinned"},
		{"dtoh", "driver_fresh", "device → fresh Go, driver"}, {"dtoh", "staged_fresh", "staged"},
	}
	gb := func(dir, v, size string) (float64, bool) {
		s, ok := sums[hostCopyPrefix+dir+"/"+v+"/"+size]
		return s.GBps, ok && s.N > 0 && s.GBps > 0
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "host copies by size (GB/s, medians; staged ÷ pinned in brackets):")
	fmt.Fprintln(w)
	head := "| size |"
	rule := "|---:|"
	for _, c := range cols {
		head += " " + c.head + " |"
		rule += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	for _, size := range sizes {
		line := "| " + size + " |"
		for _, c := range cols {
			v, ok := gb(c.dir, c.variant, size)
			switch {
			case !ok:
				line += " - |"
			case strings.HasPrefix(c.variant, "staged"):
				if p, ok := gb(c.dir, "pinned", size); ok {
					line += fmt.Sprintf(" %.1f (%.2fx) |", v, v/p)
				} else {
					line += fmt.Sprintf(" %.1f |", v)
				}
			default:
				line += fmt.Sprintf(" %.1f |", v)
			}
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
	for _, c := range []struct{ dir, suffix, what string }{{"htod", "", "Go → device"}, {"dtoh", "", "device → Go"}, {"dtoh", "_fresh", "device → fresh Go memory"}} {
		// The crossover: the smallest size from which the staged copy
		// is at least as fast as the driver's at every larger size.
		cross := ""
		for i := len(sizes) - 1; i >= 0; i-- {
			st, ok1 := gb(c.dir, "staged"+c.suffix, sizes[i])
			dr, ok2 := gb(c.dir, "driver"+c.suffix, sizes[i])
			if !ok1 || !ok2 || st < dr {
				break
			}
			cross = sizes[i]
		}
		if cross == "" {
			fmt.Fprintf(w, "staging pays (%s): at no size measured\n", c.what)
		} else {
			fmt.Fprintf(w, "staging pays (%s): from %s up\n", c.what, cross)
		}
	}
}

func mustSize(s string) uint64 {
	n, _ := parseSize(s)
	return n
}

// printSweep prints the staging sweep: each configuration's bandwidth and
// breakdown, and the best of each size and destination.
func printSweep(w io.Writer, ours []result) {
	ex := extraMedians(ours)
	type row struct {
		size, mode, config string
		s                  summary
	}
	var rows []row
	for _, s := range summarize(ours) {
		size, mode, config, ok := sweepKey(s.Name)
		if ok {
			rows = append(rows, row{size, mode, config, s})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "staging sweep, device → Go (medians; times per copy, the workers' per worker):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "size\tdestination\tconfig\tGB/s\tvs before\tDMA wait ms\tmove ms\tprefault ms\tidle ms\tworkers\tminor faults")
	before := map[string]float64{}
	for _, r := range rows {
		if strings.HasPrefix(r.config, "before-") && r.s.N > 0 {
			before[r.size+"/"+r.mode] = r.s.GBps
		}
	}
	for _, r := range rows {
		if r.s.N == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\tFAILED\t-\t-\t-\t-\t-\t-\t-\n", r.size, r.mode, r.config)
			continue
		}
		x := ex[r.s.Name]
		vs := "-"
		if b := before[r.size+"/"+r.mode]; b > 0 {
			vs = fmt.Sprintf("%.2fx", r.s.GBps/b)
		}
		faults := "-"
		if v, ok := x["minflt"]; ok {
			faults = strconv.FormatFloat(v, 'f', 0, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%s\n", r.size, r.mode, r.config, r.s.GBps, vs,
			x["wait_ms"], x["move_ms"], x["prefault_ms"], x["idle_ms"], x["workers"], faults)
	}
	tw.Flush()
	var keys []string
	best := map[string]row{}
	for _, r := range rows {
		k := r.size + " " + r.mode
		if b, ok := best[k]; r.s.N > 0 && (!ok || r.s.GBps > b.s.GBps) {
			if !ok {
				keys = append(keys, k)
			}
			best[k] = r
		}
	}
	for _, k := range keys {
		b := best[k]
		fmt.Fprintf(w, "best, %s destination: %s at %.1f GB/s", k, b.config, b.s.GBps)
		if v := before[b.size+"/"+b.mode]; v > 0 {
			fmt.Fprintf(w, " (%.2fx before)", b.s.GBps/v)
		}
		fmt.Fprintln(w)
	}
}

// parseStagingSpec reads -staging: comma-separated key=value settings
// over base. Keys: min, min_in, min_out, min_fresh (SIZE: the thresholds,
// all of them or one: into a device, out of one, out of one into fresh
// memory), chunks (KxSIZE), in, out (workers), fresh (workers into fresh
// memory; 0: out's),
// prefault (off, touch, populate), eager, huge (0 or 1), ahead (the
// goroutines that map pages ahead of the workers).
func parseStagingSpec(spec string, base staging.Params) (staging.Params, error) {
	p := base
	if spec == "" {
		return p, nil
	}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, fmt.Errorf("-staging: %q is not key=value", kv)
		}
		var err error
		switch k {
		case "min", "min_in", "min_out", "min_fresh":
			var n uint64
			n, err = parseSize(v)
			m := int(min(n, math.MaxInt))
			if k == "min" || k == "min_in" {
				p.MinBytes = m
			}
			if k == "min" || k == "min_out" {
				p.OutMinBytes = m
			}
			if k == "min" || k == "min_fresh" {
				p.FreshMinBytes = m
			}
		case "chunks":
			ks, ss, ok := strings.Cut(v, "x")
			if !ok {
				return p, fmt.Errorf("-staging: chunks=%s: want COUNTxSIZE, e.g. 4x8MiB", v)
			}
			var n uint64
			if p.Chunks, err = strconv.Atoi(ks); err == nil {
				n, err = parseSize(ss)
				p.ChunkSize = int(min(n, math.MaxInt))
			}
		case "in":
			p.InWorkers, err = strconv.Atoi(v)
		case "out":
			p.OutWorkers, err = strconv.Atoi(v)
		case "fresh":
			p.FreshWorkers, err = strconv.Atoi(v)
		case "prefault":
			p.Prefault, err = staging.ParsePrefault(v)
		case "eager":
			p.Eager, err = strconv.ParseBool(v)
		case "huge":
			p.HugePages, err = strconv.ParseBool(v)
		case "ahead":
			p.Ahead, err = strconv.Atoi(v)
		default:
			return p, fmt.Errorf("-staging: unknown key %q (want min, min_in, min_out, min_fresh, chunks, in, out, fresh, prefault, eager, huge or ahead)", k)
		}
		if err != nil {
			return p, fmt.Errorf("-staging: %s: %w", kv, err)
		}
	}
	if err := p.Check(); err != nil {
		return p, fmt.Errorf("-staging: %w", err)
	}
	return p, nil
}
