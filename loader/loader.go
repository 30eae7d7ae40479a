package loader

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// EnvDriver names the environment variable that overrides the driver search:
// when set, only that path is tried.
const EnvDriver = "CUDAMEM_DRIVER"

// abiVersion is the CUDA version (1000*major + 10*minor) whose entry-point
// signatures our calls are written against. Entry points are requested at
// this version, or at the driver's own version when that is older.
const abiVersion = 12000

// MaxArgs is the most integer arguments a call may pass.
const MaxArgs = 16

// NotFound is what a call to an unresolved entry point returns instead of a
// CUresult. No CUresult has this value.
const NotFound = ^uintptr(0)

// Attempt is one library path tried and why it failed.
type Attempt struct {
	Path string
	Err  error
}

// Reason is why the attempt failed, without the path (which dlerror and
// LoadLibrary repeat): "cannot open shared object file: No such file or
// directory" rather than "dlopen: libcuda.so.1: cannot open ...".
func (a Attempt) Reason() string {
	if a.Err == nil {
		return "<nil>"
	}
	s := a.Err.Error()
	for _, prefix := range []string{"dlopen: ", "LoadLibrary: "} {
		s = strings.TrimPrefix(s, prefix)
	}
	if a.Path != "" {
		s = strings.TrimPrefix(s, a.Path+": ")
	}
	return s
}

// LoadError reports that no driver library could be opened.
type LoadError struct {
	Attempts []Attempt
	Reason   string // set when nothing could be tried (e.g. unsupported OS)

	// FromEnv is set when the only path tried came from CUDAMEM_DRIVER
	// (see [Load]), so the error says so instead of suggesting it.
	FromEnv bool
}

// Error reads, on one line, "no CUDA driver: " and then each path tried
// with why it failed, paths failing for the same reason grouped: for
// example "no CUDA driver: libcuda.so.1, libcuda.so: cannot open shared
// object file: No such file or directory (set CUDAMEM_DRIVER to the
// driver library's path to choose it)".
func (e *LoadError) Error() string {
	if e == nil {
		return "<nil>"
	}
	var b strings.Builder
	b.WriteString("no CUDA driver")
	sep := ": "
	if e.Reason != "" {
		b.WriteString(sep + e.Reason)
		sep = "; "
	}
	for i := 0; i < len(e.Attempts); {
		reason := e.Attempts[i].Reason()
		var paths []string
		for ; i < len(e.Attempts) && e.Attempts[i].Reason() == reason; i++ {
			paths = append(paths, e.Attempts[i].Path)
		}
		b.WriteString(sep + strings.Join(paths, ", ") + ": " + reason)
		sep = "; "
	}
	if hint := e.Hint(); hint != "" {
		b.WriteString(" (" + hint + ")")
	}
	return b.String()
}

// Hint says how the search can be changed: how to choose the library with
// CUDAMEM_DRIVER, or, when it was set, that only its path was tried. It is
// empty when nothing was tried.
func (e *LoadError) Hint() string {
	switch {
	case e == nil || len(e.Attempts) == 0:
		return ""
	case e.FromEnv:
		return EnvDriver + " chose the path; unset it to search the default paths"
	}
	return "set " + EnvDriver + " to the driver library's path to choose it"
}

// InitError reports that the driver loaded but cuInit failed (for example
// CUDA_ERROR_NO_DEVICE, 100). Code is the CUresult.
type InitError struct {
	Path string
	Code int32
}

func (e *InitError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("cuInit failed with CUresult %d (driver %s)", e.Code, e.Path)
}

// Proc is one driver entry point. The zero Proc is unresolved: calls return
// NotFound.
type Proc struct {
	addr   uintptr
	name   string
	setCtx uintptr // its driver's cuCtxSetCurrent, for CallCtx
}

// Name is the entry point's base name, e.g. "cuMemAlloc" ("" for a nil
// Proc).
func (p *Proc) Name() string {
	if p == nil {
		return ""
	}
	return p.name
}

// Found reports whether the entry point was resolved (false for a nil Proc).
func (p *Proc) Found() bool { return p != nil && p.addr != 0 }

// Addr is the resolved function address (0 if unresolved or nil).
func (p *Proc) Addr() uintptr {
	if p == nil {
		return 0
	}
	return p.addr
}

// Driver is an opened CUDA driver library, from Load or Open. Its entry
// points are resolved into a table of the caller's with Resolve.
type Driver struct {
	Path    string // the library path that loaded
	Version int    // cuDriverGetVersion: 1000*major + 10*minor
	lib     *Library

	// The entry points the loader itself needs: getProcAddress resolves
	// the rest, and ctxSetCurrent is what CallCtx calls first.
	getProcAddress, driverGetVersion, cuInit, ctxSetCurrent Proc
}

// symbol describes how to resolve one entry point (the tags: see Resolve).
type symbol struct {
	name  string // base name, for cuGetProcAddress
	since int    // tag since: the CUDA version of our call's ABI, when newer than abiVersion
	dlsym string // tag dlsym: the versioned name for the dlsym fallback
	only  bool   // tag lookup:"dlsym": dlsym alone, never cuGetProcAddress
}

// Resolve fills table, a pointer to a struct, with the driver's entry
// points and returns the base names of those the driver does not provide.
// Each exported field of type Proc is the entry point named "cu" and the
// field's name, less a V<n> suffix, which marks another ABI of the same
// base name (MemcpyBatchAsyncV1 is cuMemcpyBatchAsync); other fields are
// left alone. Entry points are requested from cuGetProcAddress by base
// name at the ABI of CUDA 12.0, or at the driver's own version when that
// is older, so a newer driver keeps serving the signature the caller was
// written against. Struct tags refine that:
//
//   - since:"12020": the call speaks the ABI of that CUDA version (here
//     12.2), newer than 12.0: the entry point is requested at it, and an
//     older driver lacks it.
//   - dlsym:"cuMemAlloc_v2": the exported symbol to look up when
//     cuGetProcAddress is unavailable or refuses the name (default: the
//     base name).
//   - lookup:"dlsym": look the base name up with dlsym only, for the
//     entry points every driver exports by that name (cuDriverGetVersion).
//
// An entry point the driver lacks, or only offers with another ABI, is
// left unresolved: calling it returns NotFound. Resolved entry points are
// bound to the driver (see Bind). Resolve refuses a table that is not a
// non-nil pointer to a struct with at least one such field, or a tag it
// cannot read, with ErrInvalidArgument, before writing anything.
func (d *Driver) Resolve(table any) (missing []string, err error) {
	if d == nil {
		return nil, fmt.Errorf("Driver.Resolve: %w: nil Driver", ErrInvalidArgument)
	}
	v := reflect.ValueOf(table)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("Driver.Resolve: %w: table is %T, not a non-nil pointer to a struct", ErrInvalidArgument, table)
	}
	v = v.Elem()
	t := v.Type()
	var fields []int
	var syms []symbol
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type != reflect.TypeFor[Proc]() || !f.IsExported() {
			continue
		}
		s := symbol{name: baseName(f.Name), dlsym: f.Tag.Get("dlsym")}
		if tag := f.Tag.Get("since"); tag != "" {
			if s.since, err = strconv.Atoi(tag); err != nil {
				return nil, fmt.Errorf("Driver.Resolve: %w: %s.%s: since tag %q is not a CUDA version", ErrInvalidArgument, t, f.Name, tag)
			}
		}
		switch tag := f.Tag.Get("lookup"); tag {
		case "":
		case "dlsym":
			s.only = true
		default:
			return nil, fmt.Errorf("Driver.Resolve: %w: %s.%s: lookup tag %q (only \"dlsym\" is known)", ErrInvalidArgument, t, f.Name, tag)
		}
		fields, syms = append(fields, i), append(syms, s)
	}
	if len(fields) == 0 {
		return nil, fmt.Errorf("Driver.Resolve: %w: %s has no exported Proc fields", ErrInvalidArgument, t)
	}
	for j, i := range fields {
		p := d.resolve(syms[j])
		if !p.Found() {
			missing = append(missing, p.name)
		}
		v.Field(i).Set(reflect.ValueOf(p))
	}
	return missing, nil
}

// baseName is the entry point of a table field: "cu" and the field's name,
// less a V<n> suffix (MemcpyBatchAsyncV1 is cuMemcpyBatchAsync).
func baseName(field string) string {
	if t := strings.TrimRight(field, "0123456789"); t != field && strings.HasSuffix(t, "V") {
		field = t[:len(t)-1]
	}
	return "cu" + field
}

// SearchPaths returns the paths Load tries, in order.
func SearchPaths() []string {
	if p := os.Getenv(EnvDriver); p != "" {
		return []string{p}
	}
	return defaultPaths
}

var load = sync.OnceValues(func() (*Driver, error) { return search(os.Getenv(EnvDriver)) })

// search opens env (CUDAMEM_DRIVER's value) if it is set, else the first
// default path that loads.
func search(env string) (*Driver, error) {
	if env == "" {
		return Open(defaultPaths...)
	}
	d, err := Open(env)
	var le *LoadError
	if errors.As(err, &le) {
		le.FromEnv = true
	}
	return d, err
}

// Load opens the driver once per process (see the package documentation
// for the search order) and returns the same result to every caller. On
// an *InitError the returned Driver is non-nil so tools can still report
// the path and version.
func Load() (*Driver, error) { return load() }

// Open loads the first of paths that opens as the CUDA driver and
// initializes it with cuInit(0). Most code wants Load; Open exists for
// tools and tests that need a particular library.
func Open(paths ...string) (*Driver, error) {
	if len(paths) == 0 {
		return nil, &LoadError{Reason: noDriverReason}
	}
	le := &LoadError{}
	for _, p := range paths {
		lib, err := OpenLibrary(p)
		if err != nil {
			le.Attempts = append(le.Attempts, Attempt{p, err})
			continue
		}
		d, err := bootstrap(lib)
		if err != nil {
			lib.Close()
			le.Attempts = append(le.Attempts, Attempt{p, err})
			continue
		}
		return d, d.init()
	}
	return nil, le
}

func bootstrap(lib *Library) (*Driver, error) {
	d := &Driver{Path: lib.Path(), lib: lib}
	var err error
	if d.driverGetVersion, err = lib.Lookup("cuDriverGetVersion"); err != nil {
		return nil, fmt.Errorf("not a CUDA driver: %w", err)
	}
	if d.cuInit, err = lib.Lookup("cuInit"); err != nil {
		return nil, fmt.Errorf("not a CUDA driver: %w", err)
	}
	// v2 (CUDA 12.0+) takes a fifth argument: find tells the two apart by
	// the name Lookup recorded.
	if d.getProcAddress, err = lib.Lookup("cuGetProcAddress_v2"); err != nil {
		d.getProcAddress, _ = lib.Lookup("cuGetProcAddress") // unresolved if absent
	}
	var v int32
	if r := d.driverGetVersion.Call(uintptr(unsafe.Pointer(&v))); r != 0 {
		return nil, fmt.Errorf("cuDriverGetVersion returned CUresult %d", int32(r))
	}
	d.Version = int(v)
	return d, nil
}

// init runs cuInit(0) and resolves cuCtxSetCurrent, which CallCtx needs.
// Resolution happens even when cuInit fails, so a tool can still describe
// the driver.
func (d *Driver) init() error {
	r := int32(d.cuInit.Call(0))
	d.ctxSetCurrent = d.resolve(symbol{name: "cuCtxSetCurrent"})
	for _, p := range []*Proc{&d.getProcAddress, &d.driverGetVersion, &d.cuInit, &d.ctxSetCurrent} {
		p.setCtx = d.ctxSetCurrent.addr
		faultNote(p.addr, p.name)
	}
	if r != 0 {
		return &InitError{Path: d.Path, Code: r}
	}
	return nil
}

const procLegacyStream = 1 // CU_GET_PROC_ADDRESS_LEGACY_STREAM

// resolve finds entry point s, bound to d's cuCtxSetCurrent.
func (d *Driver) resolve(s symbol) Proc {
	p := d.find(s)
	p.name, p.setCtx = s.name, d.ctxSetCurrent.addr
	faultNote(p.addr, p.name)
	return p
}

func (d *Driver) find(s symbol) Proc {
	if s.since > d.Version {
		return Proc{}
	}
	ver := min(max(s.since, abiVersion), d.Version)
	if d.getProcAddress.Found() && !s.only {
		name := append([]byte(s.name), 0)
		var fn uintptr
		var status int32
		var r uintptr
		if d.getProcAddress.name == "cuGetProcAddress_v2" {
			r = d.getProcAddress.Call(uintptr(unsafe.Pointer(&name[0])), uintptr(unsafe.Pointer(&fn)),
				uintptr(ver), procLegacyStream, uintptr(unsafe.Pointer(&status)))
		} else {
			r = d.getProcAddress.Call(uintptr(unsafe.Pointer(&name[0])), uintptr(unsafe.Pointer(&fn)),
				uintptr(ver), procLegacyStream)
		}
		runtime.KeepAlive(name)
		if int32(r) == 0 {
			// Success with a NULL pointer means no function with our ABI.
			return Proc{addr: fn}
		}
	}
	// No resolver (a very old driver), it refused, or dlsym was asked
	// for: plain dlsym of the explicitly versioned name.
	n := s.dlsym
	if n == "" {
		n = s.name
	}
	if p, err := d.lib.Lookup(n); err == nil {
		return p
	}
	return Proc{}
}

// errNoSymbol is wrapped by Library.Lookup failures.
var errNoSymbol = errors.New("symbol not found")
