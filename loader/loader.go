package loader

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// EnvDriver names the environment variable that overrides the driver search:
// when set, only that path is tried.
const EnvDriver = "CUDAMEM_DRIVER"

// ABIVersion is the CUDA version (1000*major + 10*minor) whose entry-point
// signatures our calls are written against. Entry points are requested at
// this version, or at the driver's own version when that is older.
const ABIVersion = 12000

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

// Driver is the opened driver library and its resolved entry points. Fields
// are the entry points by base name without the "cu" prefix; see [Load].
type Driver struct {
	Path    string // the library path that loaded
	Version int    // cuDriverGetVersion: 1000*major + 10*minor
	lib     *Library

	// Bootstrap, found with dlsym.
	GetProcAddress Proc
	DriverGetVersion,
	Init Proc

	GetErrorName, GetErrorString Proc

	// Devices.
	DeviceGet, DeviceGetCount, DeviceGetName, DeviceGetUuid, DeviceTotalMem,
	DeviceGetAttribute, DeviceCanAccessPeer, DeviceGetP2PAttribute,
	DeviceGetPCIBusId, DeviceGetDefaultMemPool, DeviceGetMemPool,
	DeviceSetMemPool Proc

	// Contexts.
	DevicePrimaryCtxRetain, DevicePrimaryCtxRelease, CtxSetCurrent,
	CtxGetCurrent, CtxGetDevice, CtxSynchronize, CtxEnablePeerAccess,
	CtxDisablePeerAccess, CtxGetStreamPriorityRange Proc

	// Streams and events.
	StreamCreate, StreamCreateWithPriority, StreamDestroy, StreamSynchronize,
	StreamQuery, StreamWaitEvent, StreamGetPriority, StreamGetFlags,
	EventCreate, EventDestroy, EventRecord, EventSynchronize, EventQuery,
	EventElapsedTime Proc

	// Memory.
	MemGetInfo, MemAlloc, MemFree, MemAllocHost, MemFreeHost, MemHostAlloc,
	MemHostGetDevicePointer, MemHostRegister, MemHostUnregister,
	MemAllocManaged, MemGetAddressRange, PointerGetAttribute,
	PointerGetAttributes, Memcpy, MemcpyAsync, MemcpyPeerAsync, MemcpyHtoD,
	MemcpyDtoH, MemcpyDtoD, MemcpyHtoDAsync, MemcpyDtoHAsync,
	MemcpyDtoDAsync, MemsetD8, MemsetD32, MemsetD8Async, MemsetD16Async,
	MemsetD32Async, MemPrefetchAsync, MemAdvise, MemRangeGetAttribute Proc

	// Stream-ordered pools.
	MemAllocAsync, MemFreeAsync, MemAllocFromPoolAsync, MemPoolCreate,
	MemPoolDestroy, MemPoolSetAttribute, MemPoolGetAttribute, MemPoolTrimTo,
	MemPoolSetAccess, MemPoolGetAccess, MemPoolExportToShareableHandle,
	MemPoolImportFromShareableHandle, MemPoolExportPointer,
	MemPoolImportPointer, MemGetDefaultMemPool, MemGetMemPool,
	MemSetMemPool Proc

	// Virtual memory management.
	MemCreate, MemRelease, MemAddressReserve, MemAddressFree, MemMap,
	MemUnmap, MemSetAccess, MemGetAccess, MemGetAllocationGranularity,
	MemExportToShareableHandle, MemImportFromShareableHandle,
	MemRetainAllocationHandle, MemGetAllocationPropertiesFromHandle Proc

	// Legacy IPC.
	IpcGetMemHandle, IpcOpenMemHandle, IpcCloseMemHandle Proc

	// Modules and launches (tests and tools run small kernels).
	ModuleLoadData, ModuleUnload, ModuleGetFunction, LaunchKernel Proc

	// Contexts made elsewhere (cuCtxCreate, green contexts).
	//
	// CtxCreate is cuCtxCreate_v2 (pctx, flags, dev); CtxCreateV4 the CUDA
	// 13 default cuCtxCreate_v4 (pctx, params, flags, dev), found only on
	// drivers of 13.0 or later. StreamGetCtxV2 also reports green contexts.
	CtxCreate, CtxCreateV4, CtxDestroy, CtxPopCurrent, CtxGetId, StreamGetCtx,
	StreamGetCtxV2 Proc

	// Green contexts (CUDA 12.4+).
	DeviceGetDevResource, DevSmResourceSplitByCount, DevResourceGenerateDesc,
	GreenCtxCreate, GreenCtxDestroy, CtxFromGreenCtx, GreenCtxStreamCreate Proc

	// Stream capture and graphs.
	StreamBeginCapture, StreamEndCapture, StreamIsCapturing,
	StreamGetCaptureInfo, GraphInstantiateWithFlags, GraphLaunch,
	GraphDestroy, GraphExecDestroy, DeviceGraphMemTrim,
	DeviceGetGraphMemAttribute, DeviceSetGraphMemAttribute Proc

	// Batched copies.
	//
	// cuMemcpyBatchAsync changed ABI at CUDA 13.0: 12.8 and 12.9 take a
	// size_t *failIdx before the stream; 13.0 (cuMemcpyBatchAsync_v2)
	// dropped it. Both are resolved (a 13.x driver gives both); package
	// cuda picks one, or its loop of cuMemcpyAsync, once per driver.
	MemcpyBatchAsync, // the CUDA 13.0 ABI: no failIdx
	MemcpyBatchAsyncV1 Proc // the CUDA 12.8 ABI: with failIdx
}

// symbol describes how to resolve one entry point.
type symbol struct {
	p     *Proc
	name  string // base name, for cuGetProcAddress
	ver   int    // ABI version our call matches; 0 means ABIVersion
	since int    // the ABI changed at this version: older drivers lack ours
	dlsym string // explicit versioned name for the dlsym fallback
}

func (d *Driver) symbols() []symbol {
	return []symbol{
		{p: &d.GetErrorName, name: "cuGetErrorName"},
		{p: &d.GetErrorString, name: "cuGetErrorString"},

		{p: &d.DeviceGet, name: "cuDeviceGet"},
		{p: &d.DeviceGetCount, name: "cuDeviceGetCount"},
		{p: &d.DeviceGetName, name: "cuDeviceGetName"},
		{p: &d.DeviceGetUuid, name: "cuDeviceGetUuid", dlsym: "cuDeviceGetUuid_v2"},
		{p: &d.DeviceTotalMem, name: "cuDeviceTotalMem", dlsym: "cuDeviceTotalMem_v2"},
		{p: &d.DeviceGetAttribute, name: "cuDeviceGetAttribute"},
		{p: &d.DeviceCanAccessPeer, name: "cuDeviceCanAccessPeer"},
		{p: &d.DeviceGetP2PAttribute, name: "cuDeviceGetP2PAttribute"},
		{p: &d.DeviceGetPCIBusId, name: "cuDeviceGetPCIBusId"},
		{p: &d.DeviceGetDefaultMemPool, name: "cuDeviceGetDefaultMemPool"},
		{p: &d.DeviceGetMemPool, name: "cuDeviceGetMemPool"},
		{p: &d.DeviceSetMemPool, name: "cuDeviceSetMemPool"},

		{p: &d.DevicePrimaryCtxRetain, name: "cuDevicePrimaryCtxRetain"},
		{p: &d.DevicePrimaryCtxRelease, name: "cuDevicePrimaryCtxRelease", dlsym: "cuDevicePrimaryCtxRelease_v2"},
		{p: &d.CtxSetCurrent, name: "cuCtxSetCurrent"},
		{p: &d.CtxGetCurrent, name: "cuCtxGetCurrent"},
		{p: &d.CtxGetDevice, name: "cuCtxGetDevice"},
		{p: &d.CtxSynchronize, name: "cuCtxSynchronize"},
		{p: &d.CtxEnablePeerAccess, name: "cuCtxEnablePeerAccess"},
		{p: &d.CtxDisablePeerAccess, name: "cuCtxDisablePeerAccess"},
		{p: &d.CtxGetStreamPriorityRange, name: "cuCtxGetStreamPriorityRange"},

		{p: &d.StreamCreate, name: "cuStreamCreate"},
		{p: &d.StreamCreateWithPriority, name: "cuStreamCreateWithPriority"},
		{p: &d.StreamDestroy, name: "cuStreamDestroy", dlsym: "cuStreamDestroy_v2"},
		{p: &d.StreamSynchronize, name: "cuStreamSynchronize"},
		{p: &d.StreamQuery, name: "cuStreamQuery"},
		{p: &d.StreamWaitEvent, name: "cuStreamWaitEvent"},
		{p: &d.StreamGetPriority, name: "cuStreamGetPriority"},
		{p: &d.StreamGetFlags, name: "cuStreamGetFlags"},
		{p: &d.EventCreate, name: "cuEventCreate"},
		{p: &d.EventDestroy, name: "cuEventDestroy", dlsym: "cuEventDestroy_v2"},
		{p: &d.EventRecord, name: "cuEventRecord"},
		{p: &d.EventSynchronize, name: "cuEventSynchronize"},
		{p: &d.EventQuery, name: "cuEventQuery"},
		{p: &d.EventElapsedTime, name: "cuEventElapsedTime"},

		{p: &d.MemGetInfo, name: "cuMemGetInfo", dlsym: "cuMemGetInfo_v2"},
		{p: &d.MemAlloc, name: "cuMemAlloc", dlsym: "cuMemAlloc_v2"},
		{p: &d.MemFree, name: "cuMemFree", dlsym: "cuMemFree_v2"},
		{p: &d.MemAllocHost, name: "cuMemAllocHost", dlsym: "cuMemAllocHost_v2"},
		{p: &d.MemFreeHost, name: "cuMemFreeHost"},
		{p: &d.MemHostAlloc, name: "cuMemHostAlloc"},
		{p: &d.MemHostGetDevicePointer, name: "cuMemHostGetDevicePointer", dlsym: "cuMemHostGetDevicePointer_v2"},
		{p: &d.MemHostRegister, name: "cuMemHostRegister", dlsym: "cuMemHostRegister_v2"},
		{p: &d.MemHostUnregister, name: "cuMemHostUnregister"},
		{p: &d.MemAllocManaged, name: "cuMemAllocManaged"},
		{p: &d.MemGetAddressRange, name: "cuMemGetAddressRange", dlsym: "cuMemGetAddressRange_v2"},
		{p: &d.PointerGetAttribute, name: "cuPointerGetAttribute"},
		{p: &d.PointerGetAttributes, name: "cuPointerGetAttributes"},
		{p: &d.Memcpy, name: "cuMemcpy"},
		{p: &d.MemcpyAsync, name: "cuMemcpyAsync"},
		{p: &d.MemcpyPeerAsync, name: "cuMemcpyPeerAsync"},
		{p: &d.MemcpyHtoD, name: "cuMemcpyHtoD", dlsym: "cuMemcpyHtoD_v2"},
		{p: &d.MemcpyDtoH, name: "cuMemcpyDtoH", dlsym: "cuMemcpyDtoH_v2"},
		{p: &d.MemcpyDtoD, name: "cuMemcpyDtoD", dlsym: "cuMemcpyDtoD_v2"},
		{p: &d.MemcpyHtoDAsync, name: "cuMemcpyHtoDAsync", dlsym: "cuMemcpyHtoDAsync_v2"},
		{p: &d.MemcpyDtoHAsync, name: "cuMemcpyDtoHAsync", dlsym: "cuMemcpyDtoHAsync_v2"},
		{p: &d.MemcpyDtoDAsync, name: "cuMemcpyDtoDAsync", dlsym: "cuMemcpyDtoDAsync_v2"},
		{p: &d.MemsetD8, name: "cuMemsetD8", dlsym: "cuMemsetD8_v2"},
		{p: &d.MemsetD32, name: "cuMemsetD32", dlsym: "cuMemsetD32_v2"},
		{p: &d.MemsetD8Async, name: "cuMemsetD8Async"},
		{p: &d.MemsetD16Async, name: "cuMemsetD16Async"},
		{p: &d.MemsetD32Async, name: "cuMemsetD32Async"},
		// CUDA 12.2 changed these two to take a CUmemLocation; we speak that.
		{p: &d.MemPrefetchAsync, name: "cuMemPrefetchAsync", ver: 12020, since: 12020, dlsym: "cuMemPrefetchAsync_v2"},
		{p: &d.MemAdvise, name: "cuMemAdvise", ver: 12020, since: 12020, dlsym: "cuMemAdvise_v2"},
		{p: &d.MemRangeGetAttribute, name: "cuMemRangeGetAttribute"},

		{p: &d.MemAllocAsync, name: "cuMemAllocAsync"},
		{p: &d.MemFreeAsync, name: "cuMemFreeAsync"},
		{p: &d.MemAllocFromPoolAsync, name: "cuMemAllocFromPoolAsync"},
		{p: &d.MemPoolCreate, name: "cuMemPoolCreate"},
		{p: &d.MemPoolDestroy, name: "cuMemPoolDestroy"},
		{p: &d.MemPoolSetAttribute, name: "cuMemPoolSetAttribute"},
		{p: &d.MemPoolGetAttribute, name: "cuMemPoolGetAttribute"},
		{p: &d.MemPoolTrimTo, name: "cuMemPoolTrimTo"},
		{p: &d.MemPoolSetAccess, name: "cuMemPoolSetAccess"},
		{p: &d.MemPoolGetAccess, name: "cuMemPoolGetAccess"},
		{p: &d.MemPoolExportToShareableHandle, name: "cuMemPoolExportToShareableHandle"},
		{p: &d.MemPoolImportFromShareableHandle, name: "cuMemPoolImportFromShareableHandle"},
		{p: &d.MemPoolExportPointer, name: "cuMemPoolExportPointer"},
		{p: &d.MemPoolImportPointer, name: "cuMemPoolImportPointer"},
		// New in CUDA 13.0 (pools for host and managed locations).
		{p: &d.MemGetDefaultMemPool, name: "cuMemGetDefaultMemPool", ver: 13000, since: 13000},
		{p: &d.MemGetMemPool, name: "cuMemGetMemPool", ver: 13000, since: 13000},
		{p: &d.MemSetMemPool, name: "cuMemSetMemPool", ver: 13000, since: 13000},

		{p: &d.MemCreate, name: "cuMemCreate"},
		{p: &d.MemRelease, name: "cuMemRelease"},
		{p: &d.MemAddressReserve, name: "cuMemAddressReserve"},
		{p: &d.MemAddressFree, name: "cuMemAddressFree"},
		{p: &d.MemMap, name: "cuMemMap"},
		{p: &d.MemUnmap, name: "cuMemUnmap"},
		{p: &d.MemSetAccess, name: "cuMemSetAccess"},
		{p: &d.MemGetAccess, name: "cuMemGetAccess"},
		{p: &d.MemGetAllocationGranularity, name: "cuMemGetAllocationGranularity"},
		{p: &d.MemExportToShareableHandle, name: "cuMemExportToShareableHandle"},
		{p: &d.MemImportFromShareableHandle, name: "cuMemImportFromShareableHandle"},
		{p: &d.MemRetainAllocationHandle, name: "cuMemRetainAllocationHandle"},
		{p: &d.MemGetAllocationPropertiesFromHandle, name: "cuMemGetAllocationPropertiesFromHandle"},

		{p: &d.IpcGetMemHandle, name: "cuIpcGetMemHandle"},
		{p: &d.IpcOpenMemHandle, name: "cuIpcOpenMemHandle", dlsym: "cuIpcOpenMemHandle_v2"},
		{p: &d.IpcCloseMemHandle, name: "cuIpcCloseMemHandle"},

		{p: &d.ModuleLoadData, name: "cuModuleLoadData"},
		{p: &d.ModuleUnload, name: "cuModuleUnload"},
		{p: &d.ModuleGetFunction, name: "cuModuleGetFunction"},
		{p: &d.LaunchKernel, name: "cuLaunchKernel"},

		// Contexts made elsewhere (cuCtxCreate, green contexts).
		// cuGetProcAddress takes base names, the version choosing the ABI
		// (a name with a _vN suffix resolves to nothing on some drivers):
		// "cuCtxCreate" at our ABI (12.0) is cuCtxCreate_v2, at 13.0 (whose
		// header maps cuCtxCreate to it) cuCtxCreate_v4.
		{p: &d.CtxCreate, name: "cuCtxCreate", dlsym: "cuCtxCreate_v2"},
		{p: &d.CtxCreateV4, name: "cuCtxCreate", ver: 13000, since: 13000, dlsym: "cuCtxCreate_v4"},
		{p: &d.CtxDestroy, name: "cuCtxDestroy", dlsym: "cuCtxDestroy_v2"},
		{p: &d.CtxPopCurrent, name: "cuCtxPopCurrent", dlsym: "cuCtxPopCurrent_v2"},
		{p: &d.CtxGetId, name: "cuCtxGetId", since: 12000},
		{p: &d.StreamGetCtx, name: "cuStreamGetCtx"},
		// "cuStreamGetCtx" at 12.5 is cuStreamGetCtx_v2 (it also reports a
		// green context).
		{p: &d.StreamGetCtxV2, name: "cuStreamGetCtx", ver: 12050, since: 12050, dlsym: "cuStreamGetCtx_v2"},
		// Green contexts: CUDA 12.4 (cuGreenCtxStreamCreate 12.5).
		{p: &d.DeviceGetDevResource, name: "cuDeviceGetDevResource", ver: 12040, since: 12040},
		{p: &d.DevSmResourceSplitByCount, name: "cuDevSmResourceSplitByCount", ver: 12040, since: 12040},
		{p: &d.DevResourceGenerateDesc, name: "cuDevResourceGenerateDesc", ver: 12040, since: 12040},
		{p: &d.GreenCtxCreate, name: "cuGreenCtxCreate", ver: 12040, since: 12040},
		{p: &d.GreenCtxDestroy, name: "cuGreenCtxDestroy", ver: 12040, since: 12040},
		{p: &d.CtxFromGreenCtx, name: "cuCtxFromGreenCtx", ver: 12040, since: 12040},
		{p: &d.GreenCtxStreamCreate, name: "cuGreenCtxStreamCreate", ver: 12050, since: 12050},

		// Stream capture and graphs.
		// cuStreamBeginCapture's base name gives the _v2 ABI (with a
		// capture mode) at 12.0; cuStreamGetCaptureInfo's last ABI change
		// (_v3, edge data) came in 12.3: we pass NULL for everything but
		// the status and id, but must call the signature we get.
		{p: &d.StreamBeginCapture, name: "cuStreamBeginCapture", dlsym: "cuStreamBeginCapture_v2"},
		{p: &d.StreamEndCapture, name: "cuStreamEndCapture"},
		{p: &d.StreamIsCapturing, name: "cuStreamIsCapturing"},
		{p: &d.StreamGetCaptureInfo, name: "cuStreamGetCaptureInfo", ver: 12030, since: 12030, dlsym: "cuStreamGetCaptureInfo_v3"},
		{p: &d.GraphInstantiateWithFlags, name: "cuGraphInstantiateWithFlags"},
		{p: &d.GraphLaunch, name: "cuGraphLaunch"},
		{p: &d.GraphDestroy, name: "cuGraphDestroy"},
		{p: &d.GraphExecDestroy, name: "cuGraphExecDestroy"},
		{p: &d.DeviceGraphMemTrim, name: "cuDeviceGraphMemTrim"},
		{p: &d.DeviceGetGraphMemAttribute, name: "cuDeviceGetGraphMemAttribute"},
		{p: &d.DeviceSetGraphMemAttribute, name: "cuDeviceSetGraphMemAttribute"},

		// Batched copies.
		{p: &d.MemcpyBatchAsync, name: "cuMemcpyBatchAsync", ver: 13000, since: 13000, dlsym: "cuMemcpyBatchAsync_v2"},
		{p: &d.MemcpyBatchAsyncV1, name: "cuMemcpyBatchAsync", ver: 12080, since: 12080, dlsym: "cuMemcpyBatchAsync"},
	}
}

// Missing lists the entry points the driver did not provide. A nil Driver
// has none to list.
func (d *Driver) Missing() []string {
	if d == nil {
		return nil
	}
	var out []string
	for _, s := range d.symbols() {
		if !s.p.Found() {
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
	for _, s := range d.symbols() {
		total++
		if s.p.Found() {
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
	if d.Init, err = lib.Lookup("cuInit"); err != nil {
		return nil, fmt.Errorf("not a CUDA driver: %w", err)
	}
	// v2 (CUDA 12.0+) takes a fifth argument; remember which one we hold.
	if d.GetProcAddress, err = lib.Lookup("cuGetProcAddress_v2"); err == nil {
		d.GetProcAddress.name = "cuGetProcAddress_v2"
	} else if d.GetProcAddress, err = lib.Lookup("cuGetProcAddress"); err != nil {
		d.GetProcAddress = Proc{}
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
	r := int32(d.Init.Call(0))
	for _, s := range d.symbols() {
		*s.p = d.resolve(s)
	}
	// Each entry point carries its own driver's cuCtxSetCurrent, so
	// drivers opened side by side (tests, tools) never mix.
	for _, s := range d.symbols() {
		s.p.setCtx = d.CtxSetCurrent.addr
	}
	for _, p := range []*Proc{&d.GetProcAddress, &d.DriverGetVersion, &d.Init} {
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
	ver := s.ver
	if ver == 0 {
		ver = ABIVersion
	}
	if s.since > d.Version {
		return Proc{name: s.name}
	}
	ver = min(ver, d.Version)
	if d.GetProcAddress.Found() {
		name := append([]byte(s.name), 0)
		var fn uintptr
		var status int32
		var r uintptr
		if d.GetProcAddress.name == "cuGetProcAddress_v2" {
			r = d.GetProcAddress.Call(uintptr(unsafe.Pointer(&name[0])), uintptr(unsafe.Pointer(&fn)),
				uintptr(ver), procLegacyStream, uintptr(unsafe.Pointer(&status)))
		} else {
			r = d.GetProcAddress.Call(uintptr(unsafe.Pointer(&name[0])), uintptr(unsafe.Pointer(&fn)),
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
