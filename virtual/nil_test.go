package virtual

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/cuda"
)

// receivers lists, for every exported type of the package that has
// exported methods, the odd values each method must survive: nil pointers,
// zero values, out-of-range enums. TestEveryExportedTypeCovered keeps the
// list complete.
func receivers() map[string][]reflect.Value {
	return map[string][]reflect.Value{
		"Resource": {reflect.ValueOf((*Resource)(nil)), reflect.ValueOf(&Resource{})},
		"Access":   {reflect.ValueOf(Access(0)), reflect.ValueOf(Access(-7)), reflect.ValueOf(Access(99))},
		// Value methods on a nil *FabricChunk would panic in Go itself,
		// as for any value receiver, so only non-nil values are listed.
		"FabricChunk": {reflect.ValueOf(FabricChunk{}), reflect.ValueOf(&FabricChunk{})},
		"AsleepError": {reflect.ValueOf((*AsleepError)(nil)), reflect.ValueOf(&AsleepError{})},
		"Backup":      {reflect.ValueOf(Backup(0)), reflect.ValueOf(Backup(99))},
	}
}

// TestEveryExportedTypeCovered parses the package and fails if an exported
// type with exported methods is missing from receivers().
func TestEveryExportedTypeCovered(t *testing.T) {
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	mustOK(t, err)
	have := receivers()
	var missing []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || !fd.Name.IsExported() {
					continue
				}
				typ := fd.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				id, ok := typ.(*ast.Ident)
				if !ok || !id.IsExported() {
					continue
				}
				if _, ok := have[id.Name]; !ok {
					missing = append(missing, id.Name+"."+fd.Name.Name)
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("methods of types not in receivers(): %v", missing)
	}
}

// callAll calls every exported method of v with zero arguments (nil
// buffers, nil devices, zero sizes), failing t on a panic, and returns
// each method's error result (nil for methods without one).
func callAll(t *testing.T, v reflect.Value) map[string]error {
	t.Helper()
	out := map[string]error{}
	errType := reflect.TypeFor[error]()
	for i := 0; i < v.NumMethod(); i++ {
		m := v.Type().Method(i)
		fn := v.Method(i)
		ft := fn.Type()
		n := ft.NumIn()
		if ft.IsVariadic() {
			n-- // Call makes the variadic slice (empty) itself
		}
		args := make([]reflect.Value, n)
		for j := range args {
			args[j] = reflect.Zero(ft.In(j))
		}
		var res []reflect.Value
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%v.%s with zero arguments panics: %v", v.Type(), m.Name, p)
				}
			}()
			res = fn.Call(args)
		}()
		out[m.Name] = nil
		if len(res) > 0 && ft.Out(ft.NumOut()-1) == errType {
			if e := res[len(res)-1].Interface(); e != nil {
				out[m.Name] = e.(error)
			}
		}
	}
	return out
}

// TestNilAndZeroValues: every exported method on a nil or zero receiver
// returns an error matching cuda.ErrInvalidArgument or cuda.ErrClosed (or,
// without an error result, a plain value), never a panic. Before the fix
// nil *Resource getters (Granularity, Options, HostAccessible, ...)
// panicked.
func TestNilAndZeroValues(t *testing.T) {
	for name, vals := range receivers() {
		for _, v := range vals {
			t.Run(name, func(t *testing.T) {
				for method, err := range callAll(t, v) {
					ft, _ := v.Type().MethodByName(method)
					hasErr := ft.Type.NumOut() > 0 && ft.Type.Out(ft.Type.NumOut()-1) == reflect.TypeFor[error]()
					if !hasErr {
						continue
					}
					if err == nil {
						t.Errorf("%v.%s: no error", v.Type(), method)
						continue
					}
					if !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) {
						t.Errorf("%v.%s: %v matches neither ErrInvalidArgument nor ErrClosed", v.Type(), method, err)
					}
					if !strings.Contains(err.Error(), "virtual.") {
						t.Errorf("%v.%s: error %q names no operation", v.Type(), method, err)
					}
				}
			})
		}
	}
}

// TestZeroArguments calls every method of a working Resource with nil
// buffers and devices and zero sizes: errors must match the sentinels.
func TestZeroArguments(t *testing.T) {
	r, f := newFakeResource(t, testGran, nil)
	for method, err := range callAll(t, reflect.ValueOf(r)) {
		if err != nil && !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) {
			t.Errorf("Resource.%s with zero arguments: %v", method, err)
		}
	}
	checkInvariants(t, r, f)
}
