package cuda_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/kernels"
)

// exportedTypes lists every exported type of package cuda. The test below
// parses the package's source and fails when a type is missing here, so a
// new type cannot escape the nil/zero sweep.
var exportedTypes = map[string]reflect.Type{}

func init() {
	for _, v := range []any{
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
	} {
		t := reflect.TypeOf(v)
		exportedTypes[t.Name()] = t
	}
}

// sourceTypes returns the exported type names declared in the package's
// non-test Go files in dir.
func sourceTypes(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	var names []string
	for name, pkg := range pkgs {
		if strings.HasSuffix(name, "_test") {
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
					if ts := spec.(*ast.TypeSpec); ts.Name.IsExported() {
						names = append(names, ts.Name.Name)
					}
				}
			}
		}
	}
	sort.Strings(names)
	return names
}

// exportedInterfaces are the package's exported interface types: they
// have no zero value to call methods on, so the sweep skips them (their
// implementations are swept as the types they are).
var exportedInterfaces = map[string]bool{"FabricCalls": true}

func TestNilSafeCoversEveryExportedType(t *testing.T) {
	for _, name := range sourceTypes(t, ".") {
		if _, ok := exportedTypes[name]; !ok && !exportedInterfaces[name] {
			t.Errorf("exported type cuda.%s is missing from exportedTypes in nilsafe_test.go", name)
		}
	}
}

// callZero calls method m of recv with zero arguments (no variadic ones)
// and returns the results, or the recovered panic as an error.
func callZero(recv reflect.Value, m reflect.Method) (out []reflect.Value, panicked error) {
	fn := recv.MethodByName(m.Name)
	ft := fn.Type()
	n := ft.NumIn()
	if ft.IsVariadic() {
		n--
	}
	args := make([]reflect.Value, n)
	for i := range args {
		args[i] = reflect.Zero(ft.In(i))
	}
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn.Call(args), nil
}

var errorType = reflect.TypeOf((*error)(nil)).Elem()

// checkResults fails unless every error result is nil or matches
// ErrInvalidArgument or ErrClosed: a nil or zero handle must be refused in
// Go, never by the driver (a driver Result here means it got through).
func checkResults(t *testing.T, what string, out []reflect.Value) {
	t.Helper()
	for _, v := range out {
		if v.Type() != errorType || v.IsNil() {
			continue
		}
		err := v.Interface().(error)
		if !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) {
			t.Errorf("%s: error %q matches neither ErrInvalidArgument nor ErrClosed", what, err)
		}
		if !strings.Contains(err.Error(), ":") {
			t.Errorf("%s: error %q does not name its operation", what, err)
		}
	}
	// Anything closable that came back (it should not, from a zero
	// receiver) is closed so the sweep leaks nothing.
	for _, v := range out {
		if c, ok := v.Interface().(io.Closer); ok && v.Kind() == reflect.Pointer && !v.IsNil() {
			c.Close()
		}
	}
}

// sweep calls every exported method of every exported type on its zero
// value, and every pointer-receiver method on a nil pointer and on a
// pointer to a zero value, twice (so Close runs twice).
func sweep(t *testing.T) int {
	names := make([]string, 0, len(exportedTypes))
	for name := range exportedTypes {
		names = append(names, name)
	}
	sort.Strings(names)
	calls := 0
	for _, name := range names {
		typ := exportedTypes[name]
		ptr := reflect.PointerTo(typ)
		valueMethods := map[string]bool{}
		for i := 0; i < typ.NumMethod(); i++ {
			m := typ.Method(i)
			valueMethods[m.Name] = true
			for round := 0; round < 2; round++ {
				what := fmt.Sprintf("cuda.%s{}.%s (call %d)", name, m.Name, round+1)
				out, p := callZero(reflect.Zero(typ), m)
				calls++
				if p != nil {
					t.Errorf("%s: %v", what, p)
					continue
				}
				checkResults(t, what, out)
			}
		}
		for i := 0; i < ptr.NumMethod(); i++ {
			m := ptr.Method(i)
			if valueMethods[m.Name] {
				continue // through a nil pointer a value method must dereference: Go's rule, not ours
			}
			zero := reflect.New(typ)
			for _, recv := range []struct {
				v    reflect.Value
				desc string
			}{
				{reflect.Zero(ptr), fmt.Sprintf("(*cuda.%s)(nil).%s", name, m.Name)},
				{zero, fmt.Sprintf("(&cuda.%s{}).%s", name, m.Name)},
				{zero, fmt.Sprintf("(&cuda.%s{}).%s again", name, m.Name)},
			} {
				out, p := callZero(recv.v, m)
				calls++
				if p != nil {
					t.Errorf("%s: %v", recv.desc, p)
					continue
				}
				checkResults(t, recv.desc, out)
			}
		}
	}
	return calls
}

// TestNilAndZeroHandles is the reflection-driven soundness sweep of issue
// 6 for package cuda. It runs without a driver (CPU CI) and with one (the
// GPU machine), where a zero value reaching the driver would show up as a
// driver Result instead of ErrInvalidArgument.
func TestNilAndZeroHandles(t *testing.T) {
	calls := sweep(t)
	if calls < 200 {
		t.Errorf("the sweep made only %d calls: the type list is broken", calls)
	}
	t.Logf("%d calls on nil and zero values", calls)
}

// TestNilAndZeroHandlesWithDriver repeats the sweep once the driver is
// loaded and a device's context is current, so a zero value that slipped
// through to the driver would meet a live context rather than an
// uninitialized library.
func TestNilAndZeroHandlesWithDriver(t *testing.T) {
	d := cudatest.Device(t)
	if _, err := d.Context(); err != nil {
		t.Fatal(err)
	}
	sweep(t)
}

// TestZeroArgumentsOnLiveHandles calls every method of a real device,
// stream, event and module with zero arguments: the driver may refuse them
// (any error is fine) but nothing may panic or crash.
func TestZeroArgumentsOnLiveHandles(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m, err := d.LoadModule(mustKernels(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Close would end the handles the sweep uses; the deferred calls above
	// close them at the end. For the fd imports a zero argument is fd 0,
	// stdin: a real descriptor, not a zero value, and not ours to hand to
	// the driver.
	skip := map[string]bool{"Close": true, "ImportMemPoolFD": true, "MemImportFD": true}
	for _, recv := range []reflect.Value{reflect.ValueOf(d), reflect.ValueOf(s), reflect.ValueOf(e), reflect.ValueOf(m)} {
		typ := recv.Type()
		for i := 0; i < typ.NumMethod(); i++ {
			meth := typ.Method(i)
			if skip[meth.Name] {
				continue
			}
			what := fmt.Sprintf("%v.%s(zero arguments)", typ, meth.Name)
			out, p := callZero(recv, meth)
			if p != nil {
				t.Errorf("%s: %v", what, p)
				continue
			}
			for _, v := range out {
				if c, ok := v.Interface().(io.Closer); ok && v.Kind() == reflect.Pointer && !v.IsNil() {
					if err := c.Close(); err != nil {
						t.Errorf("%s: closing its result: %v", what, err)
					}
				}
			}
		}
	}
	// The handles still work after all that.
	if err := s.Sync(); err != nil {
		t.Errorf("stream after the sweep: %v", err)
	}
	if err := e.Record(s); err != nil {
		t.Errorf("event after the sweep: %v", err)
	}
}

func mustKernels(t *testing.T) []byte {
	t.Helper()
	return kernels.PTX()
}

// On a real device: a zero stream argument, a closed module's kernels and
// a kernel launched on another device's stream are refused in Go.
func TestLiveHandlesRefuseZeroAndClosed(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	for _, other := range []*cuda.Stream{nil, {}} {
		err := s.WaitStream(other)
		if !errors.Is(err, cuda.ErrInvalidArgument) {
			t.Errorf("WaitStream(%v): %v, want ErrInvalidArgument", other, err)
		}
	}
	m, err := d.LoadModule(mustKernels(t))
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Function("cudamem_fill_u32")
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.MemAlloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.MemFree(p)
	if err := f.Launch(s, cuda.Dim3{X: 1}, cuda.Dim3{X: 32}, 0, p, uint64(1024), uint32(7)); err != nil {
		t.Fatalf("launch on an open module: %v", err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Launch(s, cuda.Dim3{X: 1}, cuda.Dim3{X: 32}, 0, p, uint64(1024), uint32(7)); !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("launch after the module closed: %v, want ErrClosed", err)
	}
	if _, err := m.Function("cudamem_fill_u32"); !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("Function after Close: %v, want ErrClosed", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if devs, err := cuda.Devices(); err == nil && len(devs) >= 2 {
		k := cudatest.LoadKernels(t, devs[0])
		s1 := cudatest.Stream(t, devs[1])
		err := k.Fill32(s1, p, 1024, 7)
		if !errors.Is(err, cuda.ErrInvalidArgument) {
			t.Errorf("a GPU 0 kernel on a GPU 1 stream: %v, want ErrInvalidArgument", err)
		}
	}
}
