package cuda

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// driver is the loaded CUDA driver: the loader's handle on the library
// and the entry points this package calls. Each Proc field is the entry
// point named "cu" and the field's name (less a V<n> suffix, which marks
// another ABI of the same base name), and is all there is to add one: its
// tags say how it resolves (see loader.Driver.Resolve). A zero driver
// resolves nothing: every call returns loader.NotFound.
type driver struct {
	*loader.Driver
	missing []string // the entry points the driver does not provide

	// Found with dlsym: every driver exports it under this name.
	DriverGetVersion loader.Proc `lookup:"dlsym"`

	// Devices.
	DeviceGet, DeviceGetCount, DeviceGetName, DeviceGetAttribute,
	DeviceCanAccessPeer, DeviceGetPCIBusId, DeviceGetDefaultMemPool,
	DeviceGetMemPool, DeviceSetMemPool loader.Proc
	DeviceGetUuid  loader.Proc `dlsym:"cuDeviceGetUuid_v2"`
	DeviceTotalMem loader.Proc `dlsym:"cuDeviceTotalMem_v2"`

	// Contexts.
	DevicePrimaryCtxRetain, CtxSetCurrent, CtxGetCurrent, CtxGetDevice,
	CtxSynchronize, CtxEnablePeerAccess, CtxGetStreamPriorityRange loader.Proc

	// Streams and events.
	StreamCreateWithPriority, StreamSynchronize, StreamQuery,
	StreamWaitEvent, StreamGetFlags, EventCreate, EventRecord,
	EventSynchronize, EventQuery, EventElapsedTime loader.Proc
	StreamDestroy loader.Proc `dlsym:"cuStreamDestroy_v2"`
	EventDestroy  loader.Proc `dlsym:"cuEventDestroy_v2"`

	// Memory.
	MemFreeHost, MemHostAlloc, MemHostUnregister, MemAllocManaged,
	PointerGetAttribute, MemcpyAsync, MemcpyPeerAsync, MemsetD8Async,
	MemsetD16Async, MemsetD32Async loader.Proc
	MemGetInfo         loader.Proc `dlsym:"cuMemGetInfo_v2"`
	MemAlloc           loader.Proc `dlsym:"cuMemAlloc_v2"`
	MemFree            loader.Proc `dlsym:"cuMemFree_v2"`
	MemHostRegister    loader.Proc `dlsym:"cuMemHostRegister_v2"`
	MemGetAddressRange loader.Proc `dlsym:"cuMemGetAddressRange_v2"`
	MemcpyHtoD         loader.Proc `dlsym:"cuMemcpyHtoD_v2"`
	MemcpyDtoH         loader.Proc `dlsym:"cuMemcpyDtoH_v2"`
	MemcpyHtoDAsync    loader.Proc `dlsym:"cuMemcpyHtoDAsync_v2"`
	MemcpyDtoHAsync    loader.Proc `dlsym:"cuMemcpyDtoHAsync_v2"`
	// CUDA 12.2 changed these two to take a CUmemLocation; we speak that.
	MemPrefetchAsync loader.Proc `since:"12020" dlsym:"cuMemPrefetchAsync_v2"`
	MemAdvise        loader.Proc `since:"12020" dlsym:"cuMemAdvise_v2"`

	// Stream-ordered pools.
	MemAllocAsync, MemFreeAsync, MemAllocFromPoolAsync, MemPoolCreate,
	MemPoolDestroy, MemPoolSetAttribute, MemPoolGetAttribute, MemPoolTrimTo,
	MemPoolSetAccess, MemPoolGetAccess, MemPoolExportToShareableHandle,
	MemPoolImportFromShareableHandle, MemPoolExportPointer,
	MemPoolImportPointer loader.Proc
	// New in CUDA 13.0 (pools for host and managed locations).
	MemGetDefaultMemPool loader.Proc `since:"13000"`

	// Virtual memory management.
	MemCreate, MemRelease, MemAddressReserve, MemAddressFree, MemMap,
	MemUnmap, MemSetAccess, MemGetAccess, MemGetAllocationGranularity,
	MemExportToShareableHandle, MemImportFromShareableHandle,
	MemRetainAllocationHandle, MemGetAllocationPropertiesFromHandle loader.Proc

	// Legacy IPC.
	IpcGetMemHandle, IpcCloseMemHandle, IpcOpenEventHandle loader.Proc
	IpcOpenMemHandle                                       loader.Proc `dlsym:"cuIpcOpenMemHandle_v2"`

	// Modules and launches (tests and tools run small kernels).
	ModuleLoadData, ModuleUnload, ModuleGetFunction, LaunchKernel loader.Proc

	// Contexts made elsewhere (cuCtxCreate, green contexts).
	// cuGetProcAddress takes base names, the version choosing the ABI (a
	// name with a _vN suffix resolves to nothing on some drivers):
	// "cuCtxCreate" at our ABI (12.0) is cuCtxCreate_v2 (pctx, flags, dev),
	// at 13.0 (whose header maps cuCtxCreate to it) cuCtxCreate_v4 (pctx,
	// params, flags, dev). "cuStreamGetCtx" at 12.5 is cuStreamGetCtx_v2,
	// which also reports a green context.
	StreamGetCtx   loader.Proc
	CtxCreate      loader.Proc `dlsym:"cuCtxCreate_v2"`
	CtxCreateV4    loader.Proc `since:"13000" dlsym:"cuCtxCreate_v4"`
	CtxDestroy     loader.Proc `dlsym:"cuCtxDestroy_v2"`
	CtxPopCurrent  loader.Proc `dlsym:"cuCtxPopCurrent_v2"`
	CtxGetId       loader.Proc `since:"12000"`
	StreamGetCtxV2 loader.Proc `since:"12050" dlsym:"cuStreamGetCtx_v2"`

	// Green contexts: CUDA 12.4 (cuGreenCtxStreamCreate 12.5).
	DeviceGetDevResource      loader.Proc `since:"12040"`
	DevSmResourceSplitByCount loader.Proc `since:"12040"`
	DevResourceGenerateDesc   loader.Proc `since:"12040"`
	GreenCtxCreate            loader.Proc `since:"12040"`
	GreenCtxDestroy           loader.Proc `since:"12040"`
	CtxFromGreenCtx           loader.Proc `since:"12040"`
	GreenCtxStreamCreate      loader.Proc `since:"12050"`

	// Stream capture and graphs. cuStreamBeginCapture's base name gives the
	// _v2 ABI (with a capture mode) at 12.0; cuStreamGetCaptureInfo's last
	// ABI change (_v3, edge data) came in 12.3: we pass NULL for everything
	// but the status and id, but must call the signature we get.
	StreamEndCapture, StreamIsCapturing, GraphInstantiateWithFlags,
	GraphLaunch, GraphDestroy, GraphExecDestroy, DeviceGraphMemTrim,
	DeviceGetGraphMemAttribute, DeviceSetGraphMemAttribute loader.Proc
	StreamBeginCapture   loader.Proc `dlsym:"cuStreamBeginCapture_v2"`
	StreamGetCaptureInfo loader.Proc `since:"12030" dlsym:"cuStreamGetCaptureInfo_v3"`

	// Batched copies. cuMemcpyBatchAsync changed ABI at CUDA 13.0: 12.8
	// and 12.9 take a size_t *failIdx before the stream; 13.0
	// (cuMemcpyBatchAsync_v2) dropped it. Both are resolved (a 13.x driver
	// gives both); batchPathOf picks one, or its loop of cuMemcpyAsync,
	// once per driver.
	MemcpyBatchAsync   loader.Proc `since:"13000" dlsym:"cuMemcpyBatchAsync_v2"` // no failIdx
	MemcpyBatchAsyncV1 loader.Proc `since:"12080" dlsym:"cuMemcpyBatchAsync"`    // with failIdx

	// Process checkpoints (CUDA 12.8; restore's GPU pairs need 13.0):
	// checkpoint.go.
	CheckpointProcessLock, CheckpointProcessCheckpoint, CheckpointProcessRestore,
	CheckpointProcessUnlock, CheckpointProcessGetState,
	CheckpointProcessGetRestoreThreadId loader.Proc `since:"12080"`
	// Managed memory: range attributes, and the batched prefetch and
	// discard calls and current pools by location of CUDA 13.0.
	MemRangeGetAttribute            loader.Proc
	MemPrefetchBatchAsync           loader.Proc `since:"13000"`
	MemDiscardBatchAsync            loader.Proc `since:"13000"`
	MemDiscardAndPrefetchBatchAsync loader.Proc `since:"13000"`
	MemGetMemPool                   loader.Proc `since:"13000"`
}

// newDriver resolves this package's entry points from the loaded driver d.
func newDriver(d *loader.Driver) (*driver, error) {
	drv := &driver{Driver: d}
	missing, err := d.Resolve(drv)
	if err != nil {
		return nil, err
	}
	drv.missing = missing
	return drv, nil
}

// load opens the driver once; its error matches ErrNoDriver when no
// library loaded, and the cuInit Result (for example ErrorNoDevice) when
// the driver loaded but failed to initialize.
var load = sync.OnceValues(func() (*driver, error) {
	d, err := loader.Load()
	var ie *loader.InitError
	switch {
	case errors.As(err, &ie):
		return nil, &OpError{Op: "cuInit", Err: Result(ie.Code)}
	case err != nil:
		return nil, &noDriverError{err}
	}
	return newDriver(d)
})

// noDriverError is a load failure: it matches ErrNoDriver and wraps the
// loader's error (a *loader.LoadError listing what was tried), saying "no
// CUDA driver" once.
type noDriverError struct{ err error }

func (e *noDriverError) Error() string {
	msg := e.err.Error()
	if strings.HasPrefix(msg, "no CUDA driver") {
		return "cuda: " + msg
	}
	return ErrNoDriver.Error() + ": " + msg
}

func (e *noDriverError) Unwrap() []error { return []error{ErrNoDriver, e.err} }

// Driver returns the loaded driver's library path and version, loading it
// if needed.
func Driver() (path string, version int, err error) {
	d, err := load()
	if err != nil {
		return "", 0, err
	}
	return d.Path, d.Version, nil
}

// DriverMissing lists the driver entry points cudamem uses that the loaded
// driver does not provide; features that need them report ErrNotSupported.
func DriverMissing() ([]string, error) {
	d, err := load()
	if err != nil {
		return nil, err
	}
	return append([]string(nil), d.missing...), nil
}

// VersionString formats a CUDA version number (12080) as "12.8".
func VersionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// ok reports whether a raw call result is CUDA_SUCCESS. Only the low 32
// bits are meaningful: CUresult is a C int.
func ok(r uintptr) bool { return int32(r) == 0 }

// fail turns a raw call result into an error naming the entry point. Call
// it only when !ok(r).
func fail(p *loader.Proc, r uintptr) error {
	if r == loader.NotFound {
		return &OpError{Op: p.Name(), Err: fmt.Errorf("%w: the installed driver does not provide %s", ErrNotSupported, p.Name())}
	}
	return &OpError{Op: p.Name(), Err: Result(int32(r))}
}

// result is fail for any r, returning nil on success.
func result(p *loader.Proc, r uintptr) error {
	if ok(r) {
		return nil
	}
	return fail(p, r)
}

// DriverVersion asks the driver for its CUDA version (cuDriverGetVersion),
// 1000*major + 10*minor. Every call is a driver call; Driver returns the
// version read at load time.
func DriverVersion() (int, error) {
	d, err := load()
	if err != nil {
		return 0, err
	}
	var v int32
	if r := d.DriverGetVersion.Call(uintptr(unsafe.Pointer(&v))); !ok(r) {
		return 0, fail(&d.DriverGetVersion, r)
	}
	return int(v), nil
}
