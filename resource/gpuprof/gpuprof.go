package gpuprof

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// Profile builds the profile of t's allocations now. A nil t is an error
// matching cuda.ErrInvalidArgument.
func Profile(t *resource.Tracking) (*profile.Profile, error) {
	if t == nil {
		return nil, cuda.Errorf("gpuprof.Profile", cuda.ErrInvalidArgument, "nil Tracking")
	}
	b := newBuilder()
	// The totals first, then the live allocations: a live allocation's
	// site is always among the totals' (a site is never forgotten), so
	// the samples come out in the totals' order, largest first.
	for _, st := range t.Sites() {
		s := b.sample(st.Callers)
		s.Value[2] = clampInt(st.Count)
		s.Value[3] = clampInt(st.Bytes)
	}
	for _, a := range t.Live() {
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
// location per program counter, one function per name and file.
type builder struct {
	p       *profile.Profile
	mapping *profile.Mapping
	samples map[string]*profile.Sample
	locs    map[uintptr]*profile.Location
	funcs   map[[2]string]*profile.Function
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
	return &builder{p: p, mapping: m, samples: map[string]*profile.Sample{}, locs: map[uintptr]*profile.Location{}, funcs: map[[2]string]*profile.Function{}}
}

// sample returns the sample of the stack pcs, made on first use.
func (b *builder) sample(pcs []uintptr) *profile.Sample {
	key := stackKey(pcs)
	if s := b.samples[key]; s != nil {
		return s
	}
	s := &profile.Sample{Value: make([]int64, 4)}
	top := true
	for _, pc := range pcs {
		loc := b.location(pc)
		if top && loc == nil {
			continue // a frame of package resource at the top
		}
		top = false
		if loc != nil {
			s.Location = append(s.Location, loc)
		}
	}
	b.samples[key] = s
	b.p.Sample = append(b.p.Sample, s)
	return s
}

// location returns the location of pc with its frames (inlined calls
// expanded, innermost first); nil for a pc whose frames all belong to
// package resource or the runtime's goroutine exit.
func (b *builder) location(pc uintptr) *profile.Location {
	if loc, ok := b.locs[pc]; ok {
		return loc
	}
	loc := &profile.Location{Mapping: b.mapping, Address: uint64(pc)}
	frames := runtime.CallersFrames([]uintptr{pc})
	for {
		f, more := frames.Next()
		if f.Function != "" && !skipFrame(f.Function) {
			loc.Line = append(loc.Line, profile.Line{Function: b.function(f), Line: int64(f.Line)})
		}
		if !more {
			break
		}
	}
	if len(loc.Line) == 0 {
		b.locs[pc] = nil
		return nil
	}
	loc.ID = uint64(len(b.p.Location) + 1)
	b.p.Location = append(b.p.Location, loc)
	b.locs[pc] = loc
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

// skipFrame reports whether a frame says nothing about the allocation
// site: the adaptors, sub-allocator and pools of package resource, the
// timeline's Recorder and buffer.Allocate sit on top of every stack, and runtime.goexit at the
// bottom of every goroutine's.
func skipFrame(fn string) bool {
	return strings.HasPrefix(fn, "github.com/cudamem/cudamem/resource.") ||
		strings.HasPrefix(fn, "github.com/cudamem/cudamem/resource/timeline.") ||
		fn == "github.com/cudamem/cudamem/buffer.Allocate" || fn == "runtime.goexit"
}

func stackKey(pcs []uintptr) string {
	var sb strings.Builder
	sb.Grow(len(pcs) * 8)
	for _, pc := range pcs {
		v := uint64(pc)
		for i := 0; i < 8; i++ {
			sb.WriteByte(byte(v >> (8 * i)))
		}
	}
	return sb.String()
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
