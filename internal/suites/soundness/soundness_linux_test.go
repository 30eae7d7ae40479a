package soundness_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/cuda/checkpoint"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/loader"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/metrics"
	"github.com/cudamem/cudamem/resource/timeline"
	"github.com/cudamem/cudamem/virtual"
)

// types lists every exported non-interface type of the public packages,
// keyed "pkg.Name". TestEveryTypeListed parses the packages' sources and
// fails when one is missing, so a new type cannot escape the sweep.
//
// The handle types the sweep exists for: cuda.Device, Stream, Event,
// Module, Function, MemPool; buffer.Buffer; resource.DevicePool,
// PinnedPool, Managed, SyncDevice, LegacyPinned, SubAllocator, Limiting,
// Statistics, Tracking; ipc.Handle, ImportedPool; virtual.Resource;
// loader.Library, Proc, Driver. The rest (options, enums, plain data) are
// swept too: their methods must be as safe on zero values.
var types = map[string]reflect.Type{}

func register(pkg string, values ...any) {
	for _, v := range values {
		t := reflect.TypeOf(v)
		types[pkg+"."+t.Name()] = t
	}
}

func init() {
	register("cuda",
		cuda.Device{}, cuda.DeviceAttribute(0), cuda.DevicePtr(0), cuda.Dim3{}, cuda.Event{},
		cuda.EventFlags(0), cuda.Features{}, cuda.Function{}, cuda.Guard{},
		cuda.IPCMemFlags(0), cuda.IPCMemHandle{}, cuda.IPCEventHandle{}, cuda.MemAccessDesc{},
		cuda.MemAccessFlags(0), cuda.MemAdvice(0), cuda.MemAllocationCompType(0),
		cuda.MemAllocationGranularity(0), cuda.MemAllocationProp{}, cuda.MemAllocationPropFlags{},
		cuda.MemAllocationType(0), cuda.MemAttachFlags(0), cuda.MemFabricHandle{}, cuda.MemHandle(0),
		cuda.MemHandleType(0), cuda.MemHostAllocFlags(0), cuda.MemHostRegisterFlags(0),
		cuda.MemLocation{}, cuda.MemLocationType(0), cuda.MemPool{}, cuda.MemPoolAttribute(0),
		cuda.MemPoolProps{}, cuda.MemPoolPtrExportData{},
		cuda.MemoryType(0), cuda.Module{}, cuda.OpError{},
		cuda.PointerInfo{}, cuda.Result(0),
		cuda.Stream{}, cuda.StreamFlags(0), cuda.UUID{}, cuda.ForeignFunc{},
		cuda.CaptureMode(0), cuda.CaptureStatus(0), cuda.Graph{}, cuda.GraphExec{},
		cuda.GraphInstantiateFlags(0), cuda.GraphMemAttributes{},
		cuda.Context{}, cuda.ContextFlags(0),
		cuda.ProcessState(0), cuda.CheckpointGPUPair{},
		cuda.MemRangeAttribute(0), cuda.ManagedRange{},
	)
	register("cuda/checkpoint", checkpoint.Process{}, checkpoint.RestoreOptions{})
	types["cuda/checkpoint.State"] = reflect.TypeOf(checkpoint.State(0)) // an alias of cuda.ProcessState
	register("buffer", buffer.Buffer{}, buffer.Hold{})
	register("buffer/dlpack",
		dlpack.Version{}, dlpack.DeviceType(0), dlpack.Device{}, dlpack.DataTypeCode(0), dlpack.DataType{},
		dlpack.Tensor{}, dlpack.ManagedTensor{}, dlpack.ManagedTensorVersioned{}, dlpack.ExportOption(nil),
		dlpack.ImportOption(nil),
	)
	register("resource",
		resource.DevicePoolOptions{}, resource.TrimError{}, resource.DevicePool{}, resource.LegacyPinned{}, resource.Limiting{},
		resource.ManagedOptions{}, resource.Managed{}, resource.PinnedPoolOptions{}, resource.PinnedPool{},
		resource.PoolAttributes{}, resource.Stats{}, resource.Statistics{}, resource.SubAllocatorOptions{}, resource.ReleasePolicy{},
		resource.SubAllocator{}, resource.SubAllocatorStats{}, resource.SyncDevice{},
		resource.TrackingOptions{}, resource.Allocation{}, resource.Tracking{},
		resource.LoggingOptions{}, resource.Logging{}, resource.GraphMemory{},
		resource.AllocationSite{}, resource.Fallback{}, resource.RetryFunc(nil), resource.Retrying{},
		resource.SegmentHooks{},
		resource.ManagedPoolOptions{}, resource.ManagedPool{},
	)
	register("resource/metrics", metrics.Registry{}, metrics.Snapshot{})
	register("resource/timeline",
		timeline.Kind(0), timeline.Event{}, timeline.Log{}, timeline.RecorderOptions{}, timeline.Recorder{},
		timeline.Trace{}, timeline.Allocation{}, timeline.Usage{},
	)
	register("ipc", ipc.Descriptor{}, ipc.Handle{}, ipc.LegacyHandle{}, ipc.ImportedPool{}, ipc.UUID{},
		ipc.FabricHandle{})
	register("virtual",
		virtual.Chunk{}, virtual.AllocationType(0), virtual.LocationType(0), virtual.HandleType(0),
		virtual.Granularity(0), virtual.Access(0), virtual.Options{}, virtual.PoolOptions{}, virtual.Resource{}, virtual.Info{},
		virtual.FabricChunk{}, virtual.Backup(0), virtual.SleepOptions{}, virtual.WakeOptions{}, virtual.SleepStats{}, virtual.AsleepError{},
	)
	register("loader",
		loader.Library{}, loader.Attempt{}, loader.LoadError{}, loader.InitError{}, loader.Proc{}, loader.Driver{},
		loader.LibraryError{},
	)
}

// funcs are the package-level functions that take a handle: called with
// zero arguments (nil device, nil upstream, nil buffer, nil connection)
// they must refuse like methods do. Functions whose zero arguments are
// valid requests are left out: NewLegacyPinned() and NewPinnedPool(nil)
// (defaults: they allocate on a GPU), cuda.QueryPointer(0) (the driver's answer),
// cuda.GetDevice(0) (device 0 exists on a GPU machine), loader.Open()
// and Load() (they load a driver), and ipc.NewForeignHandle(0) (fd 0 is
// this process's stdin, a real file, and it takes ownership of it).
var funcs = map[string]any{
	"buffer.Owned":              buffer.Owned,
	"buffer.FromPointer":        buffer.FromPointer,
	"buffer.CopyFromHost[byte]": buffer.CopyFromHost[byte],
	"buffer.CopyToHost[byte]":   buffer.CopyToHost[byte],
	"dlpack.Export":             dlpack.Export,
	"dlpack.ExportUnversioned":  dlpack.ExportUnversioned,
	"dlpack.Import":             dlpack.Import,
	"dlpack.ImportUnversioned":  dlpack.ImportUnversioned,
	"dlpack.Delete":             dlpack.Delete,
	"dlpack.DeleteUnversioned":  dlpack.DeleteUnversioned,
	"dlpack.DeviceOf":           dlpack.DeviceOf,
	"resource.Default":          resource.Default,
	"resource.SetDefault":       resource.SetDefault,
	"resource.NewDevicePool":    resource.NewDevicePool,
	"resource.NewManaged":       resource.NewManaged,
	"resource.NewSyncDevice":    resource.NewSyncDevice,
	"resource.NewLimiting":      resource.NewLimiting,
	"resource.NewStatistics":    resource.NewStatistics,
	"resource.NewTracking":      resource.NewTracking,
	"resource.NewLogging":       resource.NewLogging,
	"resource.NewSubAllocator":  resource.NewSubAllocator,
	"resource.NewRetrying":      resource.NewRetrying,
	"resource.NewFallback":      resource.NewFallback,
	"resource.Prefetch":         resource.Prefetch,
	"resource.Advise":           resource.Advise,
	"metrics.NewRegistry":       metrics.NewRegistry,
	"timeline.NewLog":           timeline.NewLog,
	"timeline.NewRecorder":      timeline.NewRecorder,
	"timeline.ReadJSON":         timeline.ReadJSON,
	"ipc.ExportPool":            ipc.ExportPool,
	"ipc.ExportBuffer":          ipc.ExportBuffer,
	"ipc.ImportPool":            ipc.ImportPool,
	"ipc.ExportPoolFabric":      ipc.ExportPoolFabric,
	"ipc.ImportPoolFabric":      ipc.ImportPoolFabric,
	"ipc.ExportLegacy":          ipc.ExportLegacy,
	"ipc.OpenLegacy":            ipc.OpenLegacy,
	"ipc.SendFDs":               ipc.SendFDs,
	"ipc.ReceiveFDs":            ipc.ReceiveFDs,
	"ipc.SendHandle":            ipc.SendHandle,
	"ipc.ReceiveHandle":         ipc.ReceiveHandle,
	"ipc.SendPlain":             ipc.SendPlain,
	"ipc.ReceivePlain":          ipc.ReceivePlain,
	"ipc.Lookup":                ipc.Lookup,
	"ipc.NewHandle":             ipc.NewHandle,
	"ipc.NewTorchShare":         ipc.NewTorchShare,
	"buffer.Use":                buffer.Use,
	"loader.OpenCUDALibrary":    loader.OpenCUDALibrary,
	"virtual.New":               virtual.New,
	"virtual.NCCLOptions":       virtual.NCCLOptions,
	"cuda.FabricError":          cuda.FabricError,
	"cuda.Elapsed":              cuda.Elapsed,
	"cuda.WrapContext":          cuda.WrapContext,
	"cuda.WrapGreenContext":     cuda.WrapGreenContext,
	// Process checkpoints: pid 0 names no process.
	"cuda.CheckpointProcessLock":               cuda.CheckpointProcessLock,
	"cuda.CheckpointProcessCheckpoint":         cuda.CheckpointProcessCheckpoint,
	"cuda.CheckpointProcessRestore":            cuda.CheckpointProcessRestore,
	"cuda.CheckpointProcessUnlock":             cuda.CheckpointProcessUnlock,
	"cuda.CheckpointProcessGetState":           cuda.CheckpointProcessGetState,
	"cuda.CheckpointProcessGetRestoreThreadID": cuda.CheckpointProcessGetRestoreThreadID,

	// Managed pools and managed buffer operations.
	"resource.NewManagedPool":       resource.NewManagedPool,
	"resource.CurrentManagedPool":   resource.CurrentManagedPool,
	"resource.QueryManaged":         resource.QueryManaged,
	"resource.Discard":              resource.Discard,
	"resource.DiscardPrefetch":      resource.DiscardPrefetch,
	"resource.PrefetchBatch":        resource.PrefetchBatch,
	"resource.DiscardBatch":         resource.DiscardBatch,
	"resource.DiscardPrefetchBatch": resource.DiscardPrefetchBatch,
}

// skipped lists methods not called, and why. None of the handle types
// has a method that may legitimately block forever on a nil or zero
// value: each call runs under a timeout, and one that does not return is
// reported as blocked instead.
var skipped = map[string]string{}

// callTimeout bounds one call; a nil or zero value has nothing to wait for.
const callTimeout = 10 * time.Second

var errorType = reflect.TypeOf((*error)(nil)).Elem()

// outcome is what one call did.
type outcome struct {
	out     []reflect.Value
	panic   any
	blocked bool
}

func call(fn reflect.Value) outcome {
	ft := fn.Type()
	n := ft.NumIn()
	if ft.IsVariadic() {
		n-- // no variadic arguments: the zero number of them
	}
	args := make([]reflect.Value, n)
	for i := range args {
		args[i] = reflect.Zero(ft.In(i))
	}
	done := make(chan outcome, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- outcome{panic: r}
			}
		}()
		done <- outcome{out: fn.Call(args)}
	}()
	select {
	case o := <-done:
		return o
	case <-time.After(callTimeout):
		return outcome{blocked: true}
	}
}

// sweeper runs calls and records every violation.
type sweeper struct {
	t        *testing.T
	std      stdFDs
	calls    int
	problems []string
}

func (s *sweeper) run(what string, fn reflect.Value) {
	if why, ok := skipped[what]; ok {
		s.t.Logf("skipped %s: %s", what, why)
		return
	}
	before := testutil.OpenFDs()
	o := call(fn)
	s.calls++
	switch {
	case o.panic != nil:
		s.problems = append(s.problems, fmt.Sprintf("%s: panic: %v", what, o.panic))
	case o.blocked:
		s.problems = append(s.problems, fmt.Sprintf("%s: blocked for %v", what, callTimeout))
	}
	for _, v := range o.out {
		if v.Type() != errorType || v.IsNil() {
			continue
		}
		err := v.Interface().(error)
		if !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) {
			s.problems = append(s.problems, fmt.Sprintf("%s: error %q matches neither cuda.ErrInvalidArgument nor cuda.ErrClosed", what, err))
		}
	}
	// Whatever came back that can be closed is closed, so the fd check
	// sees only what the call itself did.
	for _, v := range o.out {
		if v.Kind() == reflect.Pointer && !v.IsNil() {
			if c, ok := v.Interface().(io.Closer); ok {
				c.Close()
			}
		}
	}
	if before != nil && !o.blocked {
		after := testutil.OpenFDs()
		if d := fdDiff(before, after); d != "" {
			s.problems = append(s.problems, fmt.Sprintf("%s: file descriptors changed:%s", what, d))
			s.std.restore(before, after)
		}
	}
}

// sweepTypes calls every method of every listed type: value methods on the
// zero value, pointer methods on a nil pointer and twice on one pointer to
// a zero value (so Close runs twice).
func (s *sweeper) sweepTypes() {
	names := make([]string, 0, len(types))
	for n := range types {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		typ := types[name]
		value := map[string]bool{}
		for i := 0; i < typ.NumMethod(); i++ {
			m := typ.Method(i)
			value[m.Name] = true
			s.run(fmt.Sprintf("%s{}.%s", name, m.Name), reflect.Zero(typ).Method(i))
		}
		ptr := reflect.PointerTo(typ)
		for i := 0; i < ptr.NumMethod(); i++ {
			m := ptr.Method(i)
			if value[m.Name] {
				continue // a value method through a nil pointer dereferences it: Go's rule
			}
			s.run(fmt.Sprintf("(*%s)(nil).%s", name, m.Name), reflect.Zero(ptr).Method(i))
			zero := reflect.New(typ)
			s.run(fmt.Sprintf("(&%s{}).%s", name, m.Name), zero.Method(i))
			s.run(fmt.Sprintf("(&%s{}).%s again", name, m.Name), zero.Method(i))
		}
	}
}

func (s *sweeper) sweepFuncs() {
	names := make([]string, 0, len(funcs))
	for n := range funcs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s.run(n+"(zero arguments)", reflect.ValueOf(funcs[n]))
	}
}

// TestNilAndZeroValues is the sweep. With a driver present it loads it
// first, so a zero value that got through to the driver would show as a
// driver error rather than as "no driver".
func TestNilAndZeroValues(t *testing.T) {
	if _, err := cuda.Devices(); err == nil {
		t.Log("driver loaded: zero values must be refused before reaching it")
	}
	std, err := saveStdFDs()
	if err != nil {
		t.Fatal(err)
	}
	defer std.close()
	s := &sweeper{t: t, std: std}
	s.sweepTypes()
	s.sweepFuncs()
	sort.Strings(s.problems)
	for _, p := range s.problems {
		t.Error(p)
	}
	t.Logf("%d calls, %d problems", s.calls, len(s.problems))
	if s.calls < 500 {
		t.Errorf("only %d calls: the type list is broken", s.calls)
	}
}

// TestEveryTypeListed keeps the sweep complete: every exported type of the
// public packages (interfaces aside) must be in types.
func TestEveryTypeListed(t *testing.T) {
	for _, pkg := range []string{"cuda", "cuda/checkpoint", "buffer", "buffer/dlpack", "resource", "resource/metrics", "resource/timeline", "ipc", "virtual", "loader"} {
		for _, name := range exportedTypes(t, filepath.Join("..", "..", "..", pkg)) {
			if _, ok := types[pkg+"."+name]; !ok {
				t.Errorf("exported type %s.%s is not in the soundness sweep (add it to types)", pkg, name)
			}
		}
	}
}

func exportedTypes(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	seen := map[string]bool{}
	for pname, pkg := range pkgs {
		if strings.HasSuffix(pname, "_test") {
			continue
		}
		for fname, f := range pkg.Files {
			if strings.HasSuffix(fname, "_test.go") {
				continue
			}
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.TYPE {
					continue
				}
				for _, spec := range gd.Specs {
					ts := spec.(*ast.TypeSpec)
					if _, iface := ts.Type.(*ast.InterfaceType); ts.Name.IsExported() && !iface {
						seen[ts.Name.Name] = true
					}
				}
			}
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
