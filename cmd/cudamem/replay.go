package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cmd/cudamem/internal/trace"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// replayResources are the resources replay runs a trace against.
var replayResources = []string{"suballoc", "vpool", "pool", "sync"}

// traceFlags are the flags that choose a generated trace, shared by
// replay and gentrace.
type traceFlags struct {
	gen   string
	seed  uint64
	steps int
}

func (f *traceFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.gen, "gen", "serving", "generate a trace of `KIND`: serving, training or random")
	fs.Uint64Var(&f.seed, "seed", 1, "the generated trace's seed `N` (the same seed, the same trace)")
	fs.IntVar(&f.steps, "steps", 0, "the generated trace's steps `N` (0: the kind's default: serving 1500, training 20, random 20000)")
}

func (f *traceFlags) check() error {
	if !slices.Contains(trace.Kinds, f.gen) {
		return fmt.Errorf("%w: unknown -gen %q (want serving, training or random)", errUsage, f.gen)
	}
	if f.steps < 0 || f.steps > trace.MaxSteps {
		return fmt.Errorf("%w: bad -steps %d (want 0 for the default, up to %d)", errUsage, f.steps, trace.MaxSteps)
	}
	return nil
}

func (f *traceFlags) generate() ([]trace.Op, error) {
	return trace.Generate(f.gen, f.seed, f.steps)
}

func (f *traceFlags) String() string {
	s := fmt.Sprintf("%s seed %d", f.gen, f.seed)
	if f.steps != 0 {
		s += fmt.Sprintf(" steps %d", f.steps)
	}
	return s
}

// runGentrace is `cudamem gentrace`: write a generated trace.
func runGentrace(args []string, stdout, stderr io.Writer) error {
	var tf traceFlags
	fs := newFlagSet("gentrace", stderr)
	tf.add(fs)
	out := fs.String("o", "-", "write the trace to `FILE` (- for standard output)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	}
	if err := tf.check(); err != nil {
		return err
	}
	o, err := openOut("-o", *out, stdout)
	if err != nil {
		return err
	}
	defer o.discard()
	ops, err := tf.generate()
	if err != nil {
		return err
	}
	if err := o.write(func(w io.Writer) error { return trace.Write(w, ops) }); err != nil {
		return err
	}
	if *out != "-" {
		s := trace.Summarize(ops)
		fmt.Fprintf(stdout, "%s: %s trace, %d allocations, peak %d bytes live\n", *out, &tf, s.Allocations, s.PeakLive)
	}
	return nil
}

// replayFlags are replay's command line.
type replayFlags struct {
	resource string
	in       string
	tf       traceFlags
	device   int
	maxSize  uint64
	keep     uint64
	json     bool
}

func parseReplayFlags(args []string, stderr io.Writer) (*replayFlags, error) {
	f := &replayFlags{}
	fs := newFlagSet("replay", stderr)
	fs.StringVar(&f.resource, "resource", "suballoc", "replay on `NAME`: suballoc (a SubAllocator over a device pool), vpool (virtual.NewPool), pool (a DevicePool) or sync (cuMemAlloc and cuMemFree)")
	f.keep = virtual.DefaultPoolKeepFree
	fs.Var(sizeFlag{&f.keep}, "keep", "with -resource vpool: keep `SIZE` of free memory mapped (0: none)")
	fs.StringVar(&f.in, "in", "", "replay the trace in `FILE` (lines \"a ID SIZE\" and \"f ID\"; - for standard input) instead of a generated one")
	f.tf.add(fs)
	fs.IntVar(&f.device, "device", 0, "run on the GPU with ordinal `ORDINAL`")
	fs.Var(optSizeFlag{sizeFlag{&f.maxSize}}, "max-size", "refuse a trace with an allocation above `SIZE` (e.g. 8GiB; default: the device's memory)")
	fs.BoolVar(&f.json, "json", false, "print the results as JSON")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	}
	if !slices.Contains(replayResources, f.resource) {
		return nil, fmt.Errorf("%w: unknown -resource %q (want suballoc, vpool, pool or sync)", errUsage, f.resource)
	}
	if f.device < 0 {
		return nil, fmt.Errorf("%w: bad -device %d (want a device ordinal, 0 or more)", errUsage, f.device)
	}
	set := setFlags(fs)
	if set["keep"] && f.resource != "vpool" {
		return nil, fmt.Errorf("%w: -keep is for -resource vpool", errUsage)
	}
	if f.in != "" {
		for _, name := range []string{"gen", "seed", "steps"} {
			if set[name] {
				return nil, fmt.Errorf("%w: -%s chooses a generated trace, which -in replaces", errUsage, name)
			}
		}
	} else if err := f.tf.check(); err != nil {
		return nil, err
	}
	if set["max-size"] && f.maxSize == 0 {
		return nil, fmt.Errorf("%w: bad -max-size 0 (want at least 1 byte)", errUsage)
	}
	return f, nil
}

// optSizeFlag is a sizeFlag whose 0 means "not set": -h shows no default.
type optSizeFlag struct{ sizeFlag }

func (f optSizeFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return f.sizeFlag.String()
}

// replayReport is what replay measured.
type replayReport struct {
	Resource string `json:"resource"`
	Trace    string `json:"trace"`
	Device   string `json:"device"`
	// Allocations and Frees count the trace's operations; LeftLive the
	// allocations it left live, which replay freed at the end.
	Allocations int `json:"allocations"`
	Frees       int `json:"frees"`
	LeftLive    int `json:"left_live,omitempty"`
	// PeakLive is the most bytes the trace had live at once.
	PeakLive uint64 `json:"peak_live_bytes"`
	// PeakReserved is the most bytes the resource held from the driver
	// (a pool's reserved memory, a sub-allocator's blocks, cuMemAlloc's
	// bytes); Ratio is PeakReserved over PeakLive.
	PeakReserved uint64  `json:"peak_reserved_bytes"`
	Ratio        float64 `json:"ratio"`
	// ReservedAtEnd is what the resource still held after the last free
	// (and the stream's work) was done; ReservedAfterTrim after its Trim
	// (nil for a resource without one).
	ReservedAtEnd     uint64  `json:"reserved_at_end_bytes"`
	ReservedAfterTrim *uint64 `json:"reserved_after_trim_bytes,omitempty"`
	// MeanAllocNs is the mean time of one Allocate call.
	MeanAllocNs float64 `json:"mean_alloc_ns"`
	// DeviceFreeBefore and DeviceFreeAfter are cuMemGetInfo's free bytes
	// before the resource was made and after the trim (the resource
	// still open); DeviceTotal its total.
	DeviceFreeBefore uint64 `json:"device_free_before_bytes"`
	DeviceFreeAfter  uint64 `json:"device_free_after_bytes"`
	DeviceTotal      uint64 `json:"device_total_bytes"`
}

// runReplay is `cudamem replay`.
func runReplay(args []string, stdout, stderr io.Writer) (err error) {
	f, err := parseReplayFlags(args, stderr)
	if err != nil {
		return err
	}
	var input []byte // the generated trace, as text: one reader checks both kinds
	name := f.tf.String()
	if f.in == "" {
		ops, err := f.tf.generate()
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := trace.Write(&b, ops); err != nil {
			return err
		}
		input = b.Bytes()
	} else {
		name = f.in
		if f.in == "-" { // read once: standard input cannot be read twice
			if input, err = readLimited(os.Stdin, maxStdinTrace); err != nil {
				return fmt.Errorf("-in -: %w", err)
			}
		} else if _, err := os.Stat(f.in); err != nil {
			return fmt.Errorf("-in: %w", err)
		}
	}
	dev, err := deviceFlag(f.device)
	if err != nil {
		return err
	}
	lim := trace.Limits{MaxSize: f.maxSize}
	if lim.MaxSize == 0 {
		if lim.MaxSize, err = dev.TotalMemory(); err != nil {
			return fmt.Errorf("reading the device's memory for the size limit: %w", err)
		}
	}
	open := func() (io.ReadCloser, error) {
		if f.in != "" && f.in != "-" {
			return os.Open(f.in)
		}
		return io.NopCloser(bytes.NewReader(input)), nil
	}
	// The whole trace is checked before anything is allocated: a bad line
	// is an error with nothing replayed.
	sum, err := checkTrace(open, lim)
	if err != nil && f.in != "" {
		return fmt.Errorf("%s: %w", f.in, err)
	} else if err != nil {
		return err
	}
	rep, err := replay(dev, f.resource, f.keep, open, lim)
	if err != nil {
		return err
	}
	rep.Trace = name
	rep.PeakLive = sum.PeakLive
	if rep.PeakLive > 0 {
		rep.Ratio = float64(rep.PeakReserved) / float64(rep.PeakLive)
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReplay(stdout, rep)
	return nil
}

// maxStdinTrace bounds a trace read from standard input, which is kept
// in memory (a file is read twice instead).
const maxStdinTrace = 1 << 30

func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("trace longer than %d bytes (give it as a file)", limit)
	}
	return b, nil
}

// checkTrace reads the whole trace once, checking every line.
func checkTrace(open func() (io.ReadCloser, error), lim trace.Limits) (trace.Summary, error) {
	rc, err := open()
	if err != nil {
		return trace.Summary{}, fmt.Errorf("-in: %w", err)
	}
	defer rc.Close()
	var s trace.Summary
	var live uint64
	sizes := map[uint64]uint64{}
	r := trace.NewReader(rc, lim)
	for {
		op, err := r.Next()
		if errors.Is(err, io.EOF) {
			s.LiveAtEnd = live
			return s, nil
		}
		if err != nil {
			return trace.Summary{}, err
		}
		if op.Free {
			s.Frees++
			live -= sizes[op.ID]
			delete(sizes, op.ID)
			continue
		}
		s.Allocations++
		sizes[op.ID] = op.Size
		live += op.Size
		s.PeakLive = max(s.PeakLive, live)
	}
}

// replayTarget is the resource under test and how to read what it holds.
type replayTarget struct {
	mr       buffer.MemoryResource
	peak     func() (uint64, error) // the most it held from the driver
	reserved func() (uint64, error) // what it holds now
	trim     func() error           // nil: no Trim
	close    func() error
}

// newReplayTarget makes the resource kind on dev.
// keep is vpool's KeepFree.
func newReplayTarget(dev *cuda.Device, kind string, keep uint64) (*replayTarget, error) {
	switch kind {
	case "vpool":
		p, err := virtual.NewPool(dev, &virtual.PoolOptions{Release: &resource.ReleasePolicy{KeepFree: keep}})
		if err != nil {
			return nil, err
		}
		return &replayTarget{
			mr:       p,
			peak:     func() (uint64, error) { return p.PeakReserved(), nil },
			reserved: func() (uint64, error) { return p.Stats().Reserved, nil },
			trim:     p.Trim,
			close:    p.Close,
		}, nil
	case "pool":
		p, err := resource.NewDevicePool(dev, nil)
		if err != nil {
			return nil, err
		}
		attr := func(high bool) (uint64, error) {
			a, err := p.Attributes()
			if high {
				return a.ReservedMemHigh, err
			}
			return a.ReservedMemCurrent, err
		}
		return &replayTarget{
			mr:       p,
			peak:     func() (uint64, error) { return attr(true) },
			reserved: func() (uint64, error) { return attr(false) },
			trim:     func() error { return p.Trim(0) },
			close:    p.Close,
		}, nil
	case "suballoc":
		p, err := resource.NewDevicePool(dev, nil)
		if err != nil {
			return nil, err
		}
		// The sub-allocator's blocks, counted on their way from the pool.
		up := resource.NewStatistics(p)
		sub, err := resource.NewSubAllocator(up, nil)
		if err != nil {
			return nil, errors.Join(err, p.Close())
		}
		return &replayTarget{
			mr:       sub,
			peak:     func() (uint64, error) { return up.Stats().PeakBytes, nil },
			reserved: func() (uint64, error) { return up.Stats().CurrentBytes, nil },
			trim: func() error {
				// The blocks back to the pool, the pool's memory back to
				// the driver, so that cuMemGetInfo shows it.
				if err := sub.Trim(); err != nil {
					return err
				}
				// The blocks' frees are stream-ordered: the pool gives
				// back only what a synchronization has seen freed.
				if err := dev.Sync(); err != nil {
					return err
				}
				return p.Trim(0)
			},
			close: func() error { return errors.Join(sub.Close(), p.Close()) },
		}, nil
	}
	r, err := resource.NewSyncDevice(dev)
	if err != nil {
		return nil, err
	}
	st := resource.NewStatistics(r)
	return &replayTarget{
		mr:       st,
		peak:     func() (uint64, error) { return st.Stats().PeakBytes, nil },
		reserved: func() (uint64, error) { return st.Stats().CurrentBytes, nil },
		close:    func() error { return nil },
	}, nil
}

// replay replays the trace open reads on a new resource of kind on dev,
// one stream, frees in trace order, and reports what it held.
func replay(dev *cuda.Device, kind string, keep uint64, open func() (io.ReadCloser, error), lim trace.Limits) (rep *replayReport, err error) {
	rep = &replayReport{Resource: kind, Device: dev.String()}
	if rep.DeviceFreeBefore, rep.DeviceTotal, err = dev.MemInfo(); err != nil {
		return nil, err
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	t, err := newReplayTarget(dev, kind, keep)
	if err != nil {
		return nil, fmt.Errorf("making the %s resource: %w", kind, err)
	}
	defer func() { err = errors.Join(err, t.close()) }()

	rc, err := open()
	if err != nil {
		return nil, fmt.Errorf("-in: %w", err)
	}
	defer rc.Close()
	live := map[uint64]*buffer.Buffer{}
	// Whatever happens, everything allocated is freed before the
	// resource closes.
	defer func() {
		var errs []error
		for _, b := range live {
			errs = append(errs, b.Close())
		}
		if err != nil {
			err = errors.Join(append([]error{err}, errs...)...)
		}
	}()
	r := trace.NewReader(rc, lim)
	var spent time.Duration
	for {
		op, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if op.Free {
			b := live[op.ID]
			delete(live, op.ID)
			if err := b.Close(); err != nil {
				return nil, fmt.Errorf("line %d: freeing ID %d: %w", r.Line(), op.ID, err)
			}
			rep.Frees++
			continue
		}
		t0 := time.Now()
		b, err := buffer.Allocate(t.mr, op.Size, s)
		spent += time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("line %d: allocating %d bytes for ID %d: %w", r.Line(), op.Size, op.ID, err)
		}
		live[op.ID] = b
		rep.Allocations++
	}
	// What the trace left live goes now, in ID order.
	ids := r.LiveIDs()
	slices.Sort(ids)
	rep.LeftLive = len(ids)
	for _, id := range ids {
		b := live[id]
		delete(live, id)
		if err := b.Close(); err != nil {
			return nil, fmt.Errorf("freeing ID %d, left live by the trace: %w", id, err)
		}
	}
	if rep.Allocations > 0 {
		rep.MeanAllocNs = float64(spent.Nanoseconds()) / float64(rep.Allocations)
	}
	if err := s.Sync(); err != nil {
		return nil, err
	}
	if rep.PeakReserved, err = t.peak(); err != nil {
		return nil, fmt.Errorf("reading the %s resource's peak: %w", kind, err)
	}
	if rep.ReservedAtEnd, err = t.reserved(); err != nil {
		return nil, fmt.Errorf("reading what the %s resource holds: %w", kind, err)
	}
	if t.trim != nil {
		if err := t.trim(); err != nil {
			return nil, fmt.Errorf("trimming the %s resource: %w", kind, err)
		}
		after, err := t.reserved()
		if err != nil {
			return nil, fmt.Errorf("reading what the %s resource holds: %w", kind, err)
		}
		rep.ReservedAfterTrim = &after
	}
	if rep.DeviceFreeAfter, _, err = dev.MemInfo(); err != nil {
		return nil, err
	}
	return rep, nil
}

func printReplay(w io.Writer, r *replayReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, value) }
	row("resource", r.Resource+" on "+r.Device)
	row("trace", r.Trace)
	row("allocations", fmt.Sprintf("%d (%d frees, %d left live and freed at the end)", r.Allocations, r.Frees, r.LeftLive))
	row("peak live", bytesLabel(r.PeakLive))
	row("peak reserved", bytesLabel(r.PeakReserved))
	row("reserved / live", fmt.Sprintf("%.3f", r.Ratio))
	row("reserved after last free", bytesLabel(r.ReservedAtEnd))
	if r.ReservedAfterTrim != nil {
		row("reserved after Trim", bytesLabel(*r.ReservedAfterTrim))
	} else {
		row("reserved after Trim", "- (no Trim)")
	}
	row("mean Allocate", fmtTime(r.MeanAllocNs))
	row("device free before", bytesLabel(r.DeviceFreeBefore))
	row("device free after", bytesLabel(r.DeviceFreeAfter))
	tw.Flush()
}

// bytesLabel is n in bytes and in binary units.
func bytesLabel(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%d (%.2f GiB)", n, float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d (%.1f MiB)", n, float64(n)/(1<<20))
	}
	return fmt.Sprint(n)
}
