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

// FaultInjection reports whether this binary was built with the
// cudamemfault tag, so FailCall and friends work.
const FaultInjection = faultEnabled

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
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	for i := 0; i < len(e.Attempts); {
		j, reason := i+1, e.Attempts[i].Reason()
		for j < len(e.Attempts) && e.Attempts[j].Reason() == reason {
			j++
		}
		if i == 0 && e.Reason == "" {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		for k := i; k < j; k++ {
			if k > i {
				b.WriteString(", ")
			}
			b.WriteString(e.Attempts[k].Path)
		}
		b.WriteString(": ")
		b.WriteString(reason)
		i = j
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

// Driver is the opened driver library and its resolved entry points. Each
// exported Proc field is the entry point named "cu" and the field's name
// (less a V<n> suffix, which marks another ABI of the same base name), and
// is all there is to add one: its tags say how it resolves (see symbol).
// See [Load].
type Driver struct {
	Path    string // the library path that loaded
	Version int    // cuDriverGetVersion: 1000*major + 10*minor
	lib     *Library

	// Bootstrap, found with dlsym.
	getProcAddress, cuInit Proc
	DriverGetVersion       Proc `bootstrap:"dlsym"`

	// Devices.
	DeviceGet, DeviceGetCount, DeviceGetName, DeviceGetAttribute,
	DeviceCanAccessPeer, DeviceGetPCIBusId, DeviceGetDefaultMemPool,
	DeviceGetMemPool, DeviceSetMemPool Proc
	DeviceGetUuid  Proc `dlsym:"cuDeviceGetUuid_v2"`
	DeviceTotalMem Proc `dlsym:"cuDeviceTotalMem_v2"`

	// Contexts.
	DevicePrimaryCtxRetain, CtxSetCurrent, CtxGetCurrent, CtxGetDevice,
	CtxSynchronize, CtxEnablePeerAccess, CtxGetStreamPriorityRange Proc

	// Streams and events.
	StreamCreateWithPriority, StreamSynchronize, StreamQuery,
	StreamWaitEvent, StreamGetFlags, EventCreate, EventRecord,
	EventSynchronize, EventQuery, EventElapsedTime Proc
	StreamDestroy Proc `dlsym:"cuStreamDestroy_v2"`
	EventDestroy  Proc `dlsym:"cuEventDestroy_v2"`

	// Memory.
	MemFreeHost, MemHostAlloc, MemHostUnregister, MemAllocManaged,
	PointerGetAttribute, MemcpyAsync, MemcpyPeerAsync, MemsetD8Async,
	MemsetD16Async, MemsetD32Async Proc
	MemGetInfo         Proc `dlsym:"cuMemGetInfo_v2"`
	MemAlloc           Proc `dlsym:"cuMemAlloc_v2"`
	MemFree            Proc `dlsym:"cuMemFree_v2"`
	MemHostRegister    Proc `dlsym:"cuMemHostRegister_v2"`
	MemGetAddressRange Proc `dlsym:"cuMemGetAddressRange_v2"`
	MemcpyHtoD         Proc `dlsym:"cuMemcpyHtoD_v2"`
	MemcpyDtoH         Proc `dlsym:"cuMemcpyDtoH_v2"`
	MemcpyHtoDAsync    Proc `dlsym:"cuMemcpyHtoDAsync_v2"`
	MemcpyDtoHAsync    Proc `dlsym:"cuMemcpyDtoHAsync_v2"`
	// CUDA 12.2 changed these two to take a CUmemLocation; we speak that.
	MemPrefetchAsync Proc `since:"12020" dlsym:"cuMemPrefetchAsync_v2"`
	MemAdvise        Proc `since:"12020" dlsym:"cuMemAdvise_v2"`

	// Stream-ordered pools.
	MemAllocAsync, MemFreeAsync, MemAllocFromPoolAsync, MemPoolCreate,
	MemPoolDestroy, MemPoolSetAttribute, MemPoolGetAttribute, MemPoolTrimTo,
	MemPoolSetAccess, MemPoolGetAccess, MemPoolExportToShareableHandle,
	MemPoolImportFromShareableHandle, MemPoolExportPointer,
	MemPoolImportPointer Proc
	// New in CUDA 13.0 (pools for host and managed locations).
	MemGetDefaultMemPool Proc `since:"13000"`

	// Virtual memory management.
	MemCreate, MemRelease, MemAddressReserve, MemAddressFree, MemMap,
	MemUnmap, MemSetAccess, MemGetAccess, MemGetAllocationGranularity,
	MemExportToShareableHandle, MemImportFromShareableHandle,
	MemRetainAllocationHandle, MemGetAllocationPropertiesFromHandle Proc

	// Legacy IPC.
	IpcGetMemHandle, IpcCloseMemHandle, IpcOpenEventHandle Proc
	IpcOpenMemHandle                                       Proc `dlsym:"cuIpcOpenMemHandle_v2"`

	// Modules and launches (tests and tools run small kernels).
	ModuleLoadData, ModuleUnload, ModuleGetFunction, LaunchKernel Proc

	// Contexts made elsewhere (cuCtxCreate, green contexts).
	// cuGetProcAddress takes base names, the version choosing the ABI (a
	// name with a _vN suffix resolves to nothing on some drivers):
	// "cuCtxCreate" at our ABI (12.0) is cuCtxCreate_v2 (pctx, flags, dev),
	// at 13.0 (whose header maps cuCtxCreate to it) cuCtxCreate_v4 (pctx,
	// params, flags, dev). "cuStreamGetCtx" at 12.5 is cuStreamGetCtx_v2,
	// which also reports a green context.
	StreamGetCtx   Proc
	CtxCreate      Proc `dlsym:"cuCtxCreate_v2"`
	CtxCreateV4    Proc `since:"13000" dlsym:"cuCtxCreate_v4"`
	CtxDestroy     Proc `dlsym:"cuCtxDestroy_v2"`
	CtxPopCurrent  Proc `dlsym:"cuCtxPopCurrent_v2"`
	CtxGetId       Proc `since:"12000"`
	StreamGetCtxV2 Proc `since:"12050" dlsym:"cuStreamGetCtx_v2"`

	// Green contexts: CUDA 12.4 (cuGreenCtxStreamCreate 12.5).
	DeviceGetDevResource      Proc `since:"12040"`
	DevSmResourceSplitByCount Proc `since:"12040"`
	DevResourceGenerateDesc   Proc `since:"12040"`
	GreenCtxCreate            Proc `since:"12040"`
	GreenCtxDestroy           Proc `since:"12040"`
	CtxFromGreenCtx           Proc `since:"12040"`
	GreenCtxStreamCreate      Proc `since:"12050"`

	// Stream capture and graphs. cuStreamBeginCapture's base name gives the
	// _v2 ABI (with a capture mode) at 12.0; cuStreamGetCaptureInfo's last
	// ABI change (_v3, edge data) came in 12.3: we pass NULL for everything
	// but the status and id, but must call the signature we get.
	StreamEndCapture, StreamIsCapturing, GraphInstantiateWithFlags,
	GraphLaunch, GraphDestroy, GraphExecDestroy, DeviceGraphMemTrim,
	DeviceGetGraphMemAttribute, DeviceSetGraphMemAttribute Proc
	StreamBeginCapture   Proc `dlsym:"cuStreamBeginCapture_v2"`
	StreamGetCaptureInfo Proc `since:"12030" dlsym:"cuStreamGetCaptureInfo_v3"`

	// Batched copies. cuMemcpyBatchAsync changed ABI at CUDA 13.0: 12.8
	// and 12.9 take a size_t *failIdx before the stream; 13.0
	// (cuMemcpyBatchAsync_v2) dropped it. Both are resolved (a 13.x driver
	// gives both); package cuda picks one, or its loop of cuMemcpyAsync,
	// once per driver.
	MemcpyBatchAsync   Proc `since:"13000" dlsym:"cuMemcpyBatchAsync_v2"` // no failIdx
	MemcpyBatchAsyncV1 Proc `since:"12080" dlsym:"cuMemcpyBatchAsync"`    // with failIdx
}

// symbol describes how to resolve one entry point, a Proc field of Driver.
type symbol struct {
	off  uintptr // the field's offset in Driver
	name string  // base name, for cuGetProcAddress
	// since (tag since) is the CUDA version whose ABI our call speaks,
	// when newer than abiVersion: the entry point is requested at it, and
	// older drivers lack it.
	since int
	dlsym string // explicit versioned name for the dlsym fallback (tag dlsym)
}

// symbols lists Driver's entry points, read once from its fields.
var symbols = sync.OnceValue(func() []symbol {
	var out []symbol
	t := reflect.TypeFor[Driver]()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type != reflect.TypeFor[Proc]() || !f.IsExported() || f.Tag.Get("bootstrap") != "" {
			continue
		}
		since, _ := strconv.Atoi(f.Tag.Get("since"))
		out = append(out, symbol{off: f.Offset, name: baseName(f.Name), since: since, dlsym: f.Tag.Get("dlsym")})
	}
	return out
})

// baseName is the entry point of a Driver field: "cu" and the field's name,
// less a V<n> suffix (MemcpyBatchAsyncV1 is cuMemcpyBatchAsync).
func baseName(field string) string {
	if t := strings.TrimRight(field, "0123456789"); t != field && strings.HasSuffix(t, "V") {
		field = t[:len(t)-1]
	}
	return "cu" + field
}

// proc is d's entry point s.
func (d *Driver) proc(s symbol) *Proc { return (*Proc)(unsafe.Add(unsafe.Pointer(d), s.off)) }

// Missing lists the entry points the driver did not provide. A nil Driver
// has none to list.
func (d *Driver) Missing() []string {
	if d == nil {
		return nil
	}
	var out []string
	for _, s := range symbols() {
		if !d.proc(s).Found() {
			out = append(out, s.name)
		}
	}
	return out
}

// Resolved counts the entry points the driver provided (bootstrap excluded).
func (d *Driver) Resolved() (found, total int) {
	if d == nil {
		return 0, 0
	}
	for _, s := range symbols() {
		total++
		if d.proc(s).Found() {
			found++
		}
	}
	return found, total
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

// Open loads the first of paths that opens as the CUDA driver, initializes
// it with cuInit(0) and resolves every entry point. Most code wants Load;
// Open exists for tools and tests that need a particular library.
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
	if d.DriverGetVersion, err = lib.Lookup("cuDriverGetVersion"); err != nil {
		return nil, fmt.Errorf("not a CUDA driver: %w", err)
	}
	if d.cuInit, err = lib.Lookup("cuInit"); err != nil {
		return nil, fmt.Errorf("not a CUDA driver: %w", err)
	}
	// v2 (CUDA 12.0+) takes a fifth argument; remember which one we hold.
	if d.getProcAddress, err = lib.Lookup("cuGetProcAddress_v2"); err == nil {
		d.getProcAddress.name = "cuGetProcAddress_v2"
	} else if d.getProcAddress, err = lib.Lookup("cuGetProcAddress"); err != nil {
		d.getProcAddress = Proc{}
	}
	var v int32
	if r := d.DriverGetVersion.Call(uintptr(unsafe.Pointer(&v))); r != 0 {
		return nil, fmt.Errorf("cuDriverGetVersion returned CUresult %d", int32(r))
	}
	d.Version = int(v)
	return d, nil
}

// init runs cuInit(0) and resolves the entry points. Resolution happens
// even when cuInit fails, so a tool can still describe the driver.
func (d *Driver) init() error {
	r := int32(d.cuInit.Call(0))
	for _, s := range symbols() {
		*d.proc(s) = d.resolve(s)
	}
	// Each entry point carries its own driver's cuCtxSetCurrent, so
	// drivers opened side by side (tests, tools) never mix.
	for _, s := range symbols() {
		d.proc(s).setCtx = d.CtxSetCurrent.addr
	}
	for _, p := range []*Proc{&d.getProcAddress, &d.DriverGetVersion, &d.cuInit} {
		p.setCtx = d.CtxSetCurrent.addr
	}
	if r != 0 {
		return &InitError{Path: d.Path, Code: r}
	}
	return nil
}

const (
	procLegacyStream = 1 // CU_GET_PROC_ADDRESS_LEGACY_STREAM
)

func (d *Driver) resolve(s symbol) Proc {
	if s.since > d.Version {
		return Proc{name: s.name}
	}
	ver := min(max(s.since, abiVersion), d.Version)
	if d.getProcAddress.Found() {
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
			return Proc{addr: fn, name: s.name}
		}
	}
	// No resolver (a very old driver) or it refused: plain dlsym of the
	// explicitly versioned name.
	n := s.dlsym
	if n == "" {
		n = s.name
	}
	if p, err := d.lib.Lookup(n); err == nil {
		return Proc{addr: p.addr, name: s.name}
	}
	return Proc{name: s.name}
}

// errNoSymbol is wrapped by Library.Lookup failures.
var errNoSymbol = errors.New("symbol not found")
