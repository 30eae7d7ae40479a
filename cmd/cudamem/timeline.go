package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"

	"github.com/google/pprof/profile"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cmd/cudamem/internal/timelinesvg"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/gpuprof"
	"github.com/cudamem/cudamem/resource/timeline"
)

// runTimeline is `cudamem timeline`: draw a memory timeline as SVG, of a
// demo workload run on a GPU, or of a JSON trace read with -in (which
// needs no GPU).
func runTimeline(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("timeline", stderr)
	in := fs.String("in", "", "draw the JSON trace in `FILE` (from Trace.WriteJSON or -json) instead of running the demo; needs no GPU")
	out := fs.String("o", "timeline.svg", "write the SVG to `FILE` (- for standard output)")
	jsonOut := fs.String("json", "", "also write the trace as JSON to `FILE`")
	chromeOut := fs.String("chrome", "", "also write the trace as Chrome trace-event JSON to `FILE` (for ui.perfetto.dev or chrome://tracing)")
	pprofOut := fs.String("pprof", "", "demo only: also write a pprof profile of the demo's live GPU memory by allocating stack to `FILE` (open with go tool pprof -http=: FILE)")
	dev := fs.Int("device", 0, "demo only: GPU `ORDINAL` of the demo workload")
	steps := fs.Int("steps", 12, "demo only: `N` iterations of the demo workload (0 or more)")
	capacity := fs.Int("capacity", 0, "demo only: `N` events the demo's log keeps (0: the default, 65536)")
	seed := fs.Uint64("seed", 1, "demo only: `SEED` of the demo's random sizes")
	stacks := fs.Bool("stacks", false, "demo only: capture call stacks in the demo (shown in the SVG's tooltips)")
	byEvent := fs.Bool("by-event", false, "space the x axis by event instead of time")
	maxBands := fs.Int("max-bands", 0, "draw `N` allocations as bands of their own per resource (0: 500)")
	at := fs.Uint64("at", 0, "draw the blocks after the event with sequence number `SEQ` (0: at the peak)")
	// Without -in, a demo workload runs on a GPU: a sub-allocator over
	// the device's pool, with recorders above and below it, and large
	// buffers straight from the pool. (-h prints the flags the way every
	// command does.)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set := setFlags(fs)
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	case *out == "":
		return fmt.Errorf("%w: -o needs a file name (or - for standard output)", errUsage)
	case *in != "":
		// The demo's flags shape a run that -in does not make: refused
		// rather than ignored.
		for _, name := range []string{"pprof", "device", "steps", "capacity", "seed", "stacks"} {
			if set[name] {
				return fmt.Errorf("%w: -%s applies to the demo run; -in draws a trace that was already recorded", errUsage, name)
			}
		}
	case *pprofOut == "-":
		return fmt.Errorf("%w: -pprof - would mix a binary profile into standard output (want a file name)", errUsage)
	case *dev < 0:
		return fmt.Errorf("%w: bad -device %d (want a device ordinal, 0 or more)", errUsage, *dev)
	case *steps < 0:
		return fmt.Errorf("%w: bad -steps %d (want 0 or more)", errUsage, *steps)
	case *capacity < 0:
		return fmt.Errorf("%w: bad -capacity %d (want 0 for the default, or more)", errUsage, *capacity)
	}
	if *maxBands < 0 {
		return fmt.Errorf("%w: bad -max-bands %d (want 0 for the default, or more)", errUsage, *maxBands)
	}
	if err := checkFiles([]namedFile{{"-in", *in}},
		[]namedFile{{"-o", *out}, {"-json", *jsonOut}, {"-chrome", *chromeOut}, {"-pprof", *pprofOut}}); err != nil {
		return err
	}

	// Open the outputs first: a name that cannot be written fails before
	// the demo runs. Each is written in full or not at all.
	svgOut, err := openOut("-o", *out, stdout)
	if err != nil {
		return err
	}
	defer svgOut.discard()
	var jsonFile, chromeFile, pprofFile *outFile
	for _, o := range []struct {
		f          **outFile
		flag, name string
	}{{&jsonFile, "-json", *jsonOut}, {&chromeFile, "-chrome", *chromeOut}, {&pprofFile, "-pprof", *pprofOut}} {
		if o.name == "" {
			continue
		}
		if *o.f, err = openOut(o.flag, o.name, stdout); err != nil {
			return err
		}
		defer (*o.f).discard()
	}

	var tr *timeline.Trace
	var prof *profile.Profile
	if *in != "" {
		tr, err = readTrace(*in)
	} else {
		tr, prof, err = timelineDemo(*dev, *steps, *capacity, *seed, *stacks, pprofFile != nil)
	}
	if err != nil {
		return err
	}
	if *at != 0 && !slices.ContainsFunc(tr.Events, func(e timeline.Event) bool { return e.Seq == *at }) {
		return fmt.Errorf("%w: -at %d is no event of the trace (%s)", errUsage, *at, seqRange(tr))
	}
	opts := &timelinesvg.Options{ByEvent: *byEvent, MaxBands: *maxBands, SegmentsAt: *at}
	if *in != "" {
		opts.Title = "cudamem memory timeline: " + *in
	}
	// Every output is made first, then all are put in place: one that
	// cannot be drawn or written leaves none written.
	outs := []struct {
		o    *outFile
		fill func(io.Writer) error
	}{
		{svgOut, func(w io.Writer) error { return timelinesvg.Write(w, tr, opts) }},
		{jsonFile, tr.WriteJSON},
		{chromeFile, tr.WriteChromeTrace},
	}
	if pprofFile != nil {
		outs = append(outs, struct {
			o    *outFile
			fill func(io.Writer) error
		}{pprofFile, prof.Write})
	}
	for _, o := range outs {
		if o.o == nil {
			continue
		}
		// Standard output is written at prepare: last, once every file
		// is made, so that a failure leaves nothing half written there.
		if o.o.name == "-" {
			continue
		}
		if err := o.o.prepare(func(w io.Writer) error { return plainError(o.fill(w)) }); err != nil {
			return err
		}
	}
	for _, o := range outs {
		if o.o == nil || o.o.name != "-" {
			continue
		}
		// To memory first: an error leaves standard output untouched.
		var b bytes.Buffer
		if err := plainError(o.fill(&b)); err != nil {
			return fmt.Errorf("%s -: %w", o.o.flag, err)
		}
		if err := o.o.prepare(func(w io.Writer) error { _, err := w.Write(b.Bytes()); return err }); err != nil {
			return err
		}
	}
	for _, o := range outs {
		if o.o != nil {
			if err := o.o.commit(); err != nil {
				return err
			}
		}
	}
	// The summary goes where no output does: to stderr when one is on
	// standard output.
	summary := stdout
	if *out == "-" || *jsonOut == "-" || *chromeOut == "-" {
		summary = stderr
	}
	label := *out
	if label == "-" {
		label = "timeline"
	}
	fmt.Fprintf(summary, "%s: %s\n", label, traceSummary(tr))
	return nil
}

// setFlags is the set of flags given on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// seqRange describes the sequence numbers of tr's events, for errors.
func seqRange(tr *timeline.Trace) string {
	if len(tr.Events) == 0 {
		return "it has no events"
	}
	return fmt.Sprintf("its events are %d to %d", tr.Events[0].Seq, tr.Events[len(tr.Events)-1].Seq)
}

// readTrace reads the JSON trace in the file name. Its errors say what
// failed: the file, or what in it is not a trace.
func readTrace(name string) (*timeline.Trace, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("reading the trace: %w", err) // *fs.PathError: names the file
	}
	defer f.Close()
	tr, err := timeline.ReadJSON(f)
	if err != nil {
		return nil, fmt.Errorf("reading the trace %s: %w", name, plainError(err))
	}
	return tr, nil
}

// traceSummary describes a trace in a line: events and each resource's
// peak.
func traceSummary(tr *timeline.Trace) string {
	s := fmt.Sprintf("%d events", len(tr.Events))
	if tr.Dropped > 0 {
		s += fmt.Sprintf(" (%d older dropped)", tr.Dropped)
	}
	for _, r := range tr.Resources() {
		var peak uint64
		for _, u := range tr.Usage(r) {
			peak = max(peak, u.Bytes)
		}
		s += fmt.Sprintf(", %s peak %.1f MiB", r, float64(peak)/(1<<20))
	}
	return s
}

// timelineDemo runs a small training-like workload on device ordinal:
// weights allocated once and kept, activations that grow through a
// forward pass and are freed in reverse, temporaries of random sizes,
// all through a sub-allocator over the device's pool; and large
// buffers straight from the pool, a few of them kept. Every buffer is
// written by a memset, so the addresses are real. Recorders above and
// below the sub-allocator and on the direct path share one Log. With
// wantProf, a Tracking with stacks sits on top of each path, and the
// profile of what is live at the end (both merged) is returned too.
func timelineDemo(ordinal, steps, capacity int, seed uint64, stacks, wantProf bool) (tr *timeline.Trace, prof *profile.Profile, err error) {
	dev, err := deviceFlag(ordinal)
	if err != nil {
		return nil, nil, err
	}
	pool, err := resource.CurrentDevicePool(dev) // the current pool, not owned
	if err != nil {
		return nil, nil, err
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()

	events := timeline.NewLog(capacity)
	blocks := timeline.NewRecorder(pool, events, &timeline.RecorderOptions{Name: "pool blocks", CaptureStacks: stacks})
	sub, err := resource.NewSubAllocator(blocks, &resource.SubAllocatorOptions{GrowSize: 32 << 20})
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, sub.Close()) }() // after the buffers' Close below
	var small, large buffer.MemoryResource
	small = timeline.NewRecorder(sub, events, &timeline.RecorderOptions{Name: "suballocator", CaptureStacks: stacks})
	large = timeline.NewRecorder(pool, events, &timeline.RecorderOptions{Name: "pool direct", CaptureStacks: stacks})
	var tracks []*resource.Tracking
	if wantProf {
		for _, mr := range []*buffer.MemoryResource{&small, &large} {
			t := resource.NewTracking(*mr, &resource.TrackingOptions{CaptureStacks: true})
			tracks = append(tracks, t)
			*mr = t
		}
	}

	var live []*buffer.Buffer
	defer func() {
		for _, b := range live {
			err = errors.Join(err, b.Close())
		}
		err = errors.Join(err, s.Sync())
	}()
	get := func(mr buffer.MemoryResource, n uint64) (*buffer.Buffer, error) {
		b, err := buffer.Allocate(mr, n, s)
		if err != nil {
			return nil, err
		}
		if err := s.MemsetD8Async(b.Ptr(), 0xa5, n); err != nil {
			return nil, errors.Join(err, b.Close())
		}
		return b, nil
	}
	put := func(b *buffer.Buffer) error {
		i := slices.Index(live, b)
		live = slices.Delete(live, i, i+1)
		return b.Close()
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	for i := range 8 { // weights, kept to the end
		b, err := get(small, uint64(1+i%3)<<20)
		if err != nil {
			return nil, nil, err
		}
		live = append(live, b)
	}
	for step := range steps {
		var acts []*buffer.Buffer
		for layer := range 10 { // forward: activations pile up
			b, err := get(small, uint64(256+rng.IntN(1024))<<10)
			if err != nil {
				return nil, nil, err
			}
			live, acts = append(live, b), append(acts, b)
			for range rng.IntN(4) { // temporaries, freed at once
				tmp, err := get(small, uint64(1+rng.IntN(256))<<10)
				if err != nil {
					return nil, nil, err
				}
				if err := tmp.Close(); err != nil {
					return nil, nil, err
				}
			}
			if layer == 5 && step%3 == 0 { // a large buffer now and then, from the pool directly
				b, err := get(large, uint64(64+rng.IntN(64))<<20)
				if err != nil {
					return nil, nil, err
				}
				live = append(live, b)
			}
		}
		for i := len(acts) - 1; i >= 0; i-- { // backward: freed in reverse, a few kept (a leak-like drift)
			if i == 3 && step%4 == 1 {
				continue
			}
			if err := put(acts[i]); err != nil {
				return nil, nil, err
			}
		}
	}
	if err := s.Sync(); err != nil {
		return nil, nil, err
	}
	// Everything is still live here except what the steps freed; the
	// trace is taken before the deferred frees so the blocks at the end
	// are worth drawing. (The frees still happen, after it.)
	if wantProf {
		if prof, err = demoProfile(tracks); err != nil {
			return nil, nil, err
		}
	}
	return events.Trace(), prof, nil
}

// demoProfile merges the profiles of the demo's Trackings into one.
func demoProfile(tracks []*resource.Tracking) (*profile.Profile, error) {
	var ps []*profile.Profile
	for _, t := range tracks {
		p, err := gpuprof.Profile(t)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	p, err := profile.Merge(ps)
	if err != nil {
		return nil, fmt.Errorf("merging the demo's profiles: %w", err)
	}
	return p, nil
}
