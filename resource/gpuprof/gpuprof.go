package gpuprof

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/frames"
	"github.com/cudamem/cudamem/resource"
)

// Profile builds the profile of t's allocations now. A nil t is an error
// matching cuda.ErrInvalidArgument.
func Profile(t *resource.Tracking) (*profile.Profile, error) {
	if t == nil {
		return nil, cuda.Errorf("gpuprof.Profile", cuda.ErrInvalidArgument, "nil Tracking")
	}
	b := newBuilder()
	// One snapshot, so that no site shows more in use than was allocated
	// there. The totals first: every live allocation's site is among
	// them, so the samples come in the totals' order, largest first.
	sites, live := t.Snapshot()
	for _, st := range sites {
		s := b.sample(st.Callers)
		s.Value[2] = clampInt(st.Count)
		s.Value[3] = clampInt(st.Bytes)
	}
	for _, a := range live {
		s := b.sample(a.Callers)
		s.Value[0]++
		s.Value[1] = satAdd(s.Value[1], clampInt(a.Size))
	}
	p := b.p
	if err := p.CheckValid(); err != nil {
		return nil, &cuda.OpError{Op: "gpuprof.Profile", Err: err}
	}
	return p, nil
}

// WriteHeapProfile writes the profile of t's allocations to w, in pprof's
// format (gzip-compressed protocol buffers), for `go tool pprof`.
func WriteHeapProfile(w io.Writer, t *resource.Tracking) error {
	if w == nil {
		return cuda.Errorf("gpuprof.WriteHeapProfile", cuda.ErrInvalidArgument, "nil writer")
	}
	p, err := Profile(t)
	if err != nil {
		return err
	}
	if err := p.Write(w); err != nil {
		return &cuda.OpError{Op: "gpuprof.WriteHeapProfile", Err: err}
	}
	return nil
}

// WriteFile writes the profile of t's allocations to the file name,
// replacing it whole: the profile goes to a temporary file in the same
// directory first, renamed over name once written, so that a reader never
// sees half a profile.
func WriteFile(name string, t *resource.Tracking) error {
	const op = "gpuprof.WriteFile"
	if name == "" {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "empty file name")
	}
	if t == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil Tracking")
	}
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	err = WriteHeapProfile(f, t)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		_ = os.Remove(f.Name()) // best effort: the error below says what failed
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%s: %w", name, err)}
	}
	return nil
}

// WriteOnOutOfMemory returns a hook for TrackingOptions.OnOutOfMemory
// that writes the profile of the Tracking's allocations to the file name
// (WriteFile) when an allocation finally fails with out-of-memory: what
// is live then is what filled the memory. A later failure writes the file
// again. A failure to write it is passed to report (nil: ignored), since
// the hook has no caller to return it to.
func WriteOnOutOfMemory(name string, report func(error)) func(*resource.Tracking, uint64, error) {
	return func(t *resource.Tracking, size uint64, oom error) {
		err := WriteFile(name, t)
		if err != nil && report != nil {
			report(fmt.Errorf("gpuprof: writing the profile after %d bytes failed (%v): %w", size, oom, err))
		}
	}
}

// builder assembles a profile: one sample per distinct stack, one
// location per program counter (and, for the first program counter of a
// stack whose inlined frames begin with cudamem's own, one without them),
// one function per name and file.
type builder struct {
	p       *profile.Profile
	mapping *profile.Mapping
	samples map[string]*profile.Sample
	frames  map[uintptr][]frame
	locs    map[locKey]*profile.Location
	funcs   map[[2]string]*profile.Function
}

// frame is one frame of a program counter (several when calls were
// inlined there).
type frame struct {
	fn   *profile.Function
	line int64
	own  bool // a frame of cudamem's own, left out at the top of a stack
}

// locKey is a location: the frames of pc from the from'th on (from > 0
// only at the top of a stack, past cudamem's own inlined frames).
type locKey struct {
	pc   uintptr
	from int
}

func newBuilder() *builder {
	exe, _ := os.Executable() // only a label in the viewer
	// One mapping that says the locations are symbolized already, so
	// that pprof does not look for the binary to symbolize them.
	m := &profile.Mapping{ID: 1, Start: 0, Limit: ^uint64(0), File: exe, HasFunctions: true, HasFilenames: true, HasLineNumbers: true, HasInlineFrames: true}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "inuse_objects", Unit: "count"},
			{Type: "inuse_space", Unit: "bytes"},
			{Type: "alloc_objects", Unit: "count"},
			{Type: "alloc_space", Unit: "bytes"},
		},
		DefaultSampleType: "inuse_space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		Period:            1,
		TimeNanos:         time.Now().UnixNano(),
		Mapping:           []*profile.Mapping{m},
		Comments:          []string{"GPU memory allocated through a cudamem resource.Tracking"},
	}
	return &builder{p: p, mapping: m, samples: map[string]*profile.Sample{}, frames: map[uintptr][]frame{},
		locs: map[locKey]*profile.Location{}, funcs: map[[2]string]*profile.Function{}}
}

// sample returns the sample of the stack pcs, made on first use. The
// frames of cudamem's own packages at the top of the stack are left out,
// and only those: the same frames further down (an allocation made inside
// a callback that a Retrying called) are part of the allocation site.
func (b *builder) sample(pcs []uintptr) *profile.Sample {
	key := frames.Key(pcs)
	if s := b.samples[key]; s != nil {
		return s
	}
	s := &profile.Sample{Value: make([]int64, 4)}
	top := true
	for _, pc := range pcs {
		fr := b.framesOf(pc)
		from := 0
		if top {
			for from < len(fr) && fr[from].own {
				from++
			}
			if from == len(fr) {
				continue // all cudamem's own (or nothing to show)
			}
			top = false
		}
		if loc := b.location(pc, fr, from); loc != nil {
			s.Location = append(s.Location, loc)
		}
	}
	b.samples[key] = s
	b.p.Sample = append(b.p.Sample, s)
	return s
}

// framesOf returns the frames of pc, innermost first (inlined calls
// expanded), without the runtime's goroutine exit and frames with no
// function name, which say nothing about the allocation.
func (b *builder) framesOf(pc uintptr) []frame {
	if fr, ok := b.frames[pc]; ok {
		return fr
	}
	var out []frame
	fs := runtime.CallersFrames([]uintptr{pc})
	for {
		f, more := fs.Next()
		if f.Function != "" && f.Function != "runtime.goexit" {
			out = append(out, frame{fn: b.function(f), line: int64(f.Line), own: frames.Own(f.Function)})
		}
		if !more {
			break
		}
	}
	b.frames[pc] = out
	return out
}

// location returns the location of pc's frames fr[from:]; nil if there
// are none.
func (b *builder) location(pc uintptr, fr []frame, from int) *profile.Location {
	k := locKey{pc, from}
	if loc, ok := b.locs[k]; ok {
		return loc
	}
	if from >= len(fr) {
		b.locs[k] = nil
		return nil
	}
	loc := &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: b.mapping, Address: uint64(pc)}
	for _, f := range fr[from:] {
		loc.Line = append(loc.Line, profile.Line{Function: f.fn, Line: f.line})
	}
	b.p.Location = append(b.p.Location, loc)
	b.locs[k] = loc
	return loc
}

func (b *builder) function(f runtime.Frame) *profile.Function {
	k := [2]string{f.Function, f.File}
	if fn := b.funcs[k]; fn != nil {
		return fn
	}
	fn := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: f.Function, SystemName: f.Function, Filename: f.File}
	b.funcs[k] = fn
	b.p.Function = append(b.p.Function, fn)
	return fn
}

func clampInt(v uint64) int64 {
	if v > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(v)
}

func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}
