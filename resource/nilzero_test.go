package resource_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// nilZeroTypes lists every exported type of the package;
// TestNilZeroTypesComplete fails when a type is added without being
// listed here.
var nilZeroTypes = []any{
	(*resource.DevicePool)(nil),
	(*resource.PinnedPool)(nil),
	(*resource.Managed)(nil),
	(*resource.SyncDevice)(nil),
	(*resource.LegacyPinned)(nil),
	(*resource.SubAllocator)(nil),
	(*resource.Limiting)(nil),
	(*resource.Statistics)(nil),
	(*resource.Tracking)(nil),
	(*resource.Logging)(nil),
	(*resource.GraphMemory)(nil),
	(*resource.DevicePoolOptions)(nil),
	(*resource.PinnedPoolOptions)(nil),
	(*resource.ManagedOptions)(nil),
	(*resource.SubAllocatorOptions)(nil),
	(*resource.SegmentHooks)(nil),
	(*resource.ReleasePolicy)(nil),
	(*resource.TrackingOptions)(nil),
	(*resource.LoggingOptions)(nil),
	(*resource.PoolAttributes)(nil),
	(*resource.Stats)(nil),
	(*resource.SubAllocatorStats)(nil),
	(*resource.TrimError)(nil),
	(*resource.Allocation)(nil),
	(*resource.AllocationSite)(nil),
	(*resource.Retrying)(nil),
	(*resource.Fallback)(nil),
	(*resource.RetryFunc)(nil),
	(*resource.ManagedPool)(nil),
	(*resource.ManagedPoolOptions)(nil),
}

// argSets builds arguments for a method: all zero; "plausible" values
// (a non-zero address and size, zero-value structs behind pointers, a
// callback that fails the test if called); and extreme values.
func argSets(t *testing.T, m reflect.Method) [][]reflect.Value {
	ft := m.Type
	var sets [][]reflect.Value
	for kind := range 3 {
		var args []reflect.Value
		for i := 1; i < ft.NumIn(); i++ { // 0 is the receiver
			at := ft.In(i)
			if ft.IsVariadic() && i == ft.NumIn()-1 {
				at = at.Elem()
			}
			args = append(args, argValue(t, m.Name, at, kind))
		}
		sets = append(sets, args)
	}
	return sets
}

func argValue(t *testing.T, name string, at reflect.Type, kind int) reflect.Value {
	if kind == 0 {
		return reflect.Zero(at)
	}
	switch at.Kind() {
	case reflect.Uint64, reflect.Uint, reflect.Uintptr:
		if kind == 1 {
			return reflect.ValueOf(uint64(4096)).Convert(at)
		}
		return reflect.ValueOf(uint64(math.MaxUint64)).Convert(at)
	case reflect.Int, reflect.Int32, reflect.Int64:
		if kind == 1 {
			return reflect.ValueOf(int64(1)).Convert(at)
		}
		return reflect.ValueOf(int64(-1)).Convert(at)
	case reflect.Bool:
		return reflect.ValueOf(kind == 1)
	case reflect.Pointer:
		return reflect.New(at.Elem()) // a zero value of the pointed-to type
	case reflect.Func:
		return reflect.MakeFunc(at, func([]reflect.Value) []reflect.Value {
			t.Errorf("%s called its callback on a nil or zero receiver", name)
			out := make([]reflect.Value, at.NumOut())
			for i := range out {
				out[i] = reflect.Zero(at.Out(i))
			}
			return out
		})
	case reflect.Slice:
		if kind == 1 {
			return reflect.MakeSlice(at, 1, 1)
		}
	}
	return reflect.Zero(at)
}

var errorType = reflect.TypeFor[error]()

// TestNilAndZeroValues calls every exported method of every exported type
// on a nil pointer and on a zero value, with zero, plausible and extreme
// arguments: none may panic, and every error must match
// cuda.ErrInvalidArgument or cuda.ErrClosed (a nil or zero resource never
// reaches the driver). Runs without a driver.
func TestNilAndZeroValues(t *testing.T) {
	for _, typ := range nilZeroTypes {
		pt := reflect.TypeOf(typ)
		for _, recvKind := range []string{"nil", "zero"} {
			for i := range pt.NumMethod() {
				m := pt.Method(i)
				if _, isValue := pt.Elem().MethodByName(m.Name); isValue && recvKind == "nil" {
					// A value method called through a nil pointer
					// panics in any Go type; value types are tested
					// with zero values.
					continue
				}
				for k, args := range argSets(t, m) {
					recv := reflect.Zero(pt)
					if recvKind == "zero" {
						recv = reflect.New(pt.Elem())
					}
					name := fmt.Sprintf("%s %v.%s args#%d", recvKind, pt, m.Name, k)
					func() {
						defer func() {
							if r := recover(); r != nil {
								t.Errorf("%s panicked: %v", name, r)
							}
						}()
						out := m.Func.Call(append([]reflect.Value{recv}, args...))
						for _, o := range out {
							if o.Type() != errorType || o.IsNil() {
								continue
							}
							err := o.Interface().(error)
							if !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) {
								t.Errorf("%s: error %q matches neither ErrInvalidArgument nor ErrClosed", name, err)
							}
						}
						// Buffers handed out by nil or zero resources
						// would be memory from nowhere.
						for _, o := range out {
							if b, ok := o.Interface().(*buffer.Buffer); ok && b != nil && b.Ptr() != 0 {
								t.Errorf("%s returned a buffer at %#x", name, uint64(b.Ptr()))
							}
						}
					}()
				}
			}
		}
	}
}

// TestNilAndZeroFunctions calls the package's functions with nil and zero
// arguments: errors, never panics.
func TestNilAndZeroFunctions(t *testing.T) {
	zeroDev := &cuda.Device{}
	calls := map[string]func() error{
		"CurrentDevicePool(nil)":     func() error { _, err := resource.CurrentDevicePool(nil); return err },
		"NewDevicePool(zero device)": func() error { _, err := resource.NewDevicePool(zeroDev, &resource.DevicePoolOptions{}); return err },
		"NewManaged(nil)":            func() error { _, err := resource.NewManaged(nil, nil); return err },
		"NewManaged(zero device)":    func() error { _, err := resource.NewManaged(zeroDev, &resource.ManagedOptions{}); return err },
		"NewSyncDevice(nil)":         func() error { _, err := resource.NewSyncDevice(nil); return err },
		"NewSyncDevice(zero device)": func() error { _, err := resource.NewSyncDevice(zeroDev); return err },
		"NewSubAllocator(nil)":       func() error { _, err := resource.NewSubAllocator(nil, nil); return err },
		"NewSubAllocator(nil ptr)": func() error {
			_, err := resource.NewSubAllocator((*resource.DevicePool)(nil), nil)
			return err
		},
		"Default(nil)":              func() error { _, err := resource.Default(nil); return err },
		"Default(zero device)":      func() error { _, err := resource.Default(zeroDev); return err },
		"SetDefault(nil, nil)":      func() error { return resource.SetDefault(nil, nil) },
		"SetDefault(zero, nil)":     func() error { return resource.SetDefault(zeroDev, nil) },
		"Prefetch(nil)":             func() error { return resource.Prefetch(nil, cuda.MemLocation{Type: cuda.MemLocationTypeHost}, nil) },
		"Advise(nil)":               func() error { return resource.Advise(nil, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}) },
		"NewLimiting(nil).Allocate": func() error { _, err := resource.NewLimiting(nil, 1).Allocate(1, nil); return err },
		"NewStatistics(nil).Alloc":  func() error { _, err := resource.NewStatistics(nil).Allocate(1, nil); return err },
		"NewTracking(nil).Allocate": func() error { _, err := resource.NewTracking(nil, nil).Allocate(1, nil); return err },
		"NewTracking(nil).Dealloc":  func() error { return resource.NewTracking(nil, nil).Deallocate(4096, 1, nil) },
		"NewLogging(nil).Allocate":  func() error { _, err := resource.NewLogging(nil, nil, nil).Allocate(1, nil); return err },
		"NewLogging(nil).Dealloc":   func() error { return resource.NewLogging(nil, nil, nil).Deallocate(4096, 1, nil) },
		"NewLimiting(nil ptr).Alloc": func() error {
			_, err := resource.NewLimiting((*resource.SubAllocator)(nil), 1).Allocate(1, nil)
			return err
		},
	}
	for name, call := range calls {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", name, r)
				}
			}()
			err := call()
			if err == nil {
				t.Errorf("%s: no error", name)
			}
		}()
	}
}

// TestZeroBufferArgs passes a zero buffer.Buffer to the functions that
// take buffers. It needs buffer's own zero-value safety (issue 6), and
// skips until that is in.
func TestZeroBufferArgs(t *testing.T) {
	if !zeroBufferSafe() {
		t.Skip("a zero buffer.Buffer still panics in package buffer; this test runs once buffer's zero-value fix is merged")
	}
	host := cuda.MemLocation{Type: cuda.MemLocationTypeHost}
	for name, call := range map[string]func() error{
		"Prefetch": func() error { return resource.Prefetch(&buffer.Buffer{}, host, nil) },
		"Advise": func() error {
			return resource.Advise(&buffer.Buffer{}, cuda.MemAdviseSetReadMostly, cuda.MemLocation{})
		},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s(zero buffer) panicked: %v", name, r)
				}
			}()
			if err := call(); err != nil && !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) {
				t.Errorf("%s(zero buffer): %v", name, err)
			}
		}()
	}
}

func zeroBufferSafe() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	b := &buffer.Buffer{}
	_, _ = b.Ptr(), b.Resource()
	return true
}

// TestNilZeroTypesComplete parses the package's sources and checks that
// every exported type is in nilZeroTypes, so the nil/zero sweep covers
// types added later.
func TestNilZeroTypesComplete(t *testing.T) {
	listed := map[string]bool{}
	for _, typ := range nilZeroTypes {
		listed[reflect.TypeOf(typ).Elem().Name()] = true
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, sp := range g.Specs {
				ts := sp.(*ast.TypeSpec)
				if ts.Name.IsExported() && !listed[ts.Name.Name] {
					t.Errorf("exported type %s (%s) is missing from nilZeroTypes", ts.Name.Name, name)
				}
			}
		}
	}
}
