package cuda

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Device is one CUDA device, identified by its ordinal, seen through one
// CUDA context, and safe for concurrent use. GetDevice's values are
// singletons, one per GPU, using the GPU's primary context (retained on
// first use, kept for the life of the process). Every driver call makes
// the Device's context current inside that call. WrapContext and
// Device.NewContext give views through other contexts (see Context).
type Device struct {
	ordinal int
	handle  int32 // CUdevice
	drv     *driver

	// bind is set for a view of a context other than the primary one
	// (WrapContext, NewContext): ctx is then that context, set at
	// creation, and never the primary context.
	bind *binding

	// The primary context, once retained (a failed retain is tried again).
	// ctx is written once, under ctxMu, before ctxOK is set; readers that
	// see ctxOK see ctx.
	ctxOK atomic.Bool
	ctxMu sync.Mutex
	ctx   uintptr // CUcontext (primary), 0 until retained

	defaultStream Stream

	// gate is the capture rule's state for the context: the captures in
	// flight, the calls they must not overlap, and the work deferred
	// until none is left (capturerule.go).
	gate captureGate

	waiter waiter // shares cuCtxSynchronize among SyncContext callers

	// features is what Features read, once every attribute was read
	// without error (constructors check features on every call).
	features atomic.Pointer[Features]
}

// maxDevices bounds the device count a driver may report: a larger (or
// negative) count means a broken or hostile driver.
const maxDevices = 1 << 12

// deviceCount asks the driver how many devices it has. Tests replace it to
// play a driver that reports nonsense.
var deviceCount = func(d *driver) (int32, uintptr) {
	var n int32
	r := d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n)))
	return n, r
}

// retainPrimary retains d's primary context. Tests replace it to play a
// driver whose retain fails.
var retainPrimary = func(d *Device) (uintptr, error) {
	var c uintptr
	if r := d.drv.DevicePrimaryCtxRetain.Call(uintptr(unsafe.Pointer(&c)), uintptr(d.handle)); !ok(r) {
		return 0, fail(&d.drv.DevicePrimaryCtxRetain, r)
	}
	return c, nil
}

// deviceTable is the process's device list. Only a successful enumeration
// is kept (a failed one is tried again on the next call), published once
// so devices stay singletons.
type deviceTable struct {
	list atomic.Pointer[[]*Device] // nil until an enumeration succeeded
	mu   sync.Mutex                // serializes enumerations
}

var devTable deviceTable

func devices() ([]*Device, error) { return devTable.get(load) }

// get returns the device list, enumerating the driver from load if no
// enumeration has succeeded yet. The fast path is one atomic load.
func (t *deviceTable) get(load func() (*driver, error)) ([]*Device, error) {
	if l := t.list.Load(); l != nil {
		return *l, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.list.Load(); l != nil {
		return *l, nil // another goroutine enumerated meanwhile
	}
	d, err := load()
	if err != nil {
		return nil, err
	}
	ds, err := enumerate(d)
	if err != nil {
		return nil, err
	}
	t.list.Store(&ds)
	return ds, nil
}

// enumerate builds the device table of driver d.
func enumerate(d *driver) ([]*Device, error) {
	n, r := deviceCount(d)
	if !ok(r) {
		return nil, fail(&d.DeviceGetCount, r)
	}
	if n < 0 || n > maxDevices {
		return nil, &OpError{Op: "cuDeviceGetCount", Err: fmt.Errorf("%w: the driver reported %d devices (expected 0 to %d)", ErrorUnknown, n, maxDevices)}
	}
	out := make([]*Device, n)
	for i := range out {
		var h int32
		if r := d.DeviceGet.Call(uintptr(unsafe.Pointer(&h)), uintptr(i)); !ok(r) {
			return nil, fmt.Errorf("device %d: %w", i, fail(&d.DeviceGet, r))
		}
		dev := &Device{ordinal: i, handle: h, drv: d}
		dev.defaultStream = Stream{dev: dev}
		out[i] = dev
	}
	return out, nil
}

// DeviceCount returns the number of CUDA devices.
func DeviceCount() (int, error) {
	ds, err := devices()
	return len(ds), err
}

// Devices returns every CUDA device, in ordinal order.
func Devices() ([]*Device, error) {
	ds, err := devices()
	if err != nil {
		return nil, err
	}
	return append([]*Device(nil), ds...), nil
}

// GetDevice returns the device with the given ordinal. An ordinal out of
// range is an ErrInvalidArgument naming the ordinal and the device count.
func GetDevice(ordinal int) (*Device, error) {
	if ordinal < 0 {
		return nil, Errorf("GetDevice", ErrInvalidArgument, "negative device ordinal %d", ordinal)
	}
	ds, err := devices()
	if err != nil {
		return nil, err
	}
	if ordinal >= len(ds) {
		return nil, Errorf("GetDevice", ErrInvalidArgument, "device ordinal %d out of range (%d devices)", ordinal, len(ds))
	}
	return ds[ordinal], nil
}

// Ordinal is the device's ordinal (0, 1, ...), or -1 for a nil or zero
// Device, which stands for no device (as a resource's DeviceID does).
func (d *Device) Ordinal() int {
	if !d.valid() {
		return -1
	}
	return d.ordinal
}

// String returns "GPU <ordinal>" ("GPU <nil>" for a nil or zero Device);
// a view of a non-primary context adds it: "GPU 0 (context 0x5612...)".
func (d *Device) String() string {
	switch {
	case !d.valid():
		return "GPU <nil>"
	case d.bind != nil && d.green() != 0:
		return fmt.Sprintf("GPU %d (green context %#x)", d.ordinal, d.green())
	case d.bind != nil:
		return fmt.Sprintf("GPU %d (context %#x)", d.ordinal, d.ctx)
	}
	return fmt.Sprintf("GPU %d", d.ordinal)
}

// valid reports whether d came from this package (GetDevice, Devices):
// only those carry a driver. A nil or zero Device has none, and every
// method refuses it before any driver call.
func (d *Device) valid() bool { return d != nil && d.drv != nil }

// check returns the error for a call named op on an invalid device.
func (d *Device) check(op string) error {
	if d.valid() {
		return nil
	}
	if d == nil {
		return Errorf(op, ErrInvalidArgument, "nil device (use cuda.GetDevice or cuda.Devices)")
	}
	return Errorf(op, ErrInvalidArgument, "zero Device value (use cuda.GetDevice or cuda.Devices)")
}

// contextFor is context for a call named op, refusing an invalid device
// with an error naming op.
func (d *Device) contextFor(op string) (uintptr, error) {
	if err := d.check(op); err != nil {
		return 0, err
	}
	if err := d.contextClosed(op); err != nil {
		return 0, err
	}
	return d.context()
}

// context returns the retained primary context.
func (d *Device) context() (uintptr, error) {
	if err := d.check("Device.Context"); err != nil {
		return 0, err
	}
	if err := d.contextClosed("Device.Context"); err != nil {
		return 0, err
	}
	if d.ctxOK.Load() {
		return d.ctx, nil
	}
	d.ctxMu.Lock()
	defer d.ctxMu.Unlock()
	if d.ctxOK.Load() {
		return d.ctx, nil // retained by another goroutine meanwhile
	}
	c, err := retainPrimary(d)
	if err != nil {
		return 0, err
	}
	d.setContext(c)
	return c, nil
}

// setContext records c as the retained primary context. Held ctxMu (or d
// not yet shared: tests make devices with a context already set).
func (d *Device) setContext(c uintptr) {
	d.ctx = c
	d.ctxOK.Store(true)
}

// Context returns the device's CUcontext handle: for GetDevice's values
// the primary context, retained on first use; for a view from WrapContext
// or NewContext its own context (an error matching ErrClosed once a
// NewContext context was closed). It is for interoperating with other CUDA
// code; cudamem makes it current by itself where needed.
func (d *Device) Context() (uintptr, error) { return d.context() }

// Name returns the device's product name.
func (d *Device) Name() (string, error) {
	if err := d.check("Device.Name"); err != nil {
		return "", err
	}
	var buf [256]byte
	if r := d.drv.DeviceGetName.Call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d.handle)); !ok(r) {
		return "", fail(&d.drv.DeviceGetName, r)
	}
	s, _, _ := bytes.Cut(buf[:], []byte{0})
	return string(s), nil
}

// UUID returns the device's UUID (its GPUString is what nvidia-smi -L prints).
func (d *Device) UUID() (UUID, error) {
	if err := d.check("Device.UUID"); err != nil {
		return UUID{}, err
	}
	var u UUID
	if r := d.drv.DeviceGetUuid.Call(uintptr(unsafe.Pointer(&u)), uintptr(d.handle)); !ok(r) {
		return u, fail(&d.drv.DeviceGetUuid, r)
	}
	return u, nil
}

// PCIBusID returns the device's PCI bus ID (domain:bus:device.function).
func (d *Device) PCIBusID() (string, error) {
	if err := d.check("Device.PCIBusID"); err != nil {
		return "", err
	}
	var buf [64]byte
	if r := d.drv.DeviceGetPCIBusId.Call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d.handle)); !ok(r) {
		return "", fail(&d.drv.DeviceGetPCIBusId, r)
	}
	s, _, _ := bytes.Cut(buf[:], []byte{0})
	return string(s), nil
}

// TotalMemory returns the device's memory size in bytes.
func (d *Device) TotalMemory() (uint64, error) {
	if err := d.check("Device.TotalMemory"); err != nil {
		return 0, err
	}
	var n uint64
	if r := d.drv.DeviceTotalMem.Call(uintptr(unsafe.Pointer(&n)), uintptr(d.handle)); !ok(r) {
		return 0, fail(&d.drv.DeviceTotalMem, r)
	}
	return n, nil
}

// Attribute returns a device attribute.
func (d *Device) Attribute(a DeviceAttribute) (int, error) {
	if err := d.check("Device.Attribute"); err != nil {
		return 0, err
	}
	var v int32
	if r := d.drv.DeviceGetAttribute.Call(uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(d.handle)); !ok(r) {
		return 0, fmt.Errorf("device attribute %v: %w", a, fail(&d.drv.DeviceGetAttribute, r))
	}
	return int(v), nil
}

// ComputeCapability returns the device's compute capability (9, 0 for a
// Hopper GPU).
func (d *Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(DeviceAttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	minor, err = d.Attribute(DeviceAttrComputeCapabilityMinor)
	return major, minor, err
}

// CanAccessPeer reports whether this device can map memory of peer (both
// directions are separate questions). A device cannot be its own peer.
func (d *Device) CanAccessPeer(peer *Device) (bool, error) {
	if err := d.check("Device.CanAccessPeer"); err != nil {
		return false, err
	}
	if !peer.valid() {
		return false, Errorf("Device.CanAccessPeer", ErrInvalidArgument, "nil or zero peer device")
	}
	if peer.drv != d.drv {
		return false, Errorf("Device.CanAccessPeer", ErrInvalidArgument, "%v and peer %v belong to different driver instances", d, peer)
	}
	if peer.handle == d.handle {
		return false, nil // the same GPU, through whatever contexts
	}
	var v int32
	if r := d.drv.DeviceCanAccessPeer.Call(uintptr(unsafe.Pointer(&v)), uintptr(d.handle), uintptr(peer.handle)); !ok(r) {
		return false, fail(&d.drv.DeviceCanAccessPeer, r)
	}
	return v != 0, nil
}

// Features says which memory features a device supports.
type Features struct {
	MemoryPools             bool // stream-ordered allocation (cuMemAllocAsync, pools)
	VirtualMemory           bool // cuMemCreate / cuMemMap and friends
	PosixFDHandles          bool // VMM allocations exportable as POSIX fds
	PoolIPC                 bool // memory pools exportable as POSIX fds
	GPUDirectRDMA           bool // GPUDirect RDMA
	GPUDirectRDMAWithVMM    bool // GPUDirect RDMA on VMM allocations
	ManagedMemory           bool // cuMemAllocManaged
	ConcurrentManagedAccess bool // host and device may touch managed memory concurrently
	PageableMemoryAccess    bool // the device can read pageable host memory
	HostNUMAID              int  // the host NUMA node nearest the device, -1 if unknown
}

// Features queries the device's memory features. The driver is asked once:
// the first answer in which every attribute was read is kept (attributes do
// not change), and later calls return it without a driver call.
func (d *Device) Features() (Features, error) {
	if d.valid() && d.bind != nil {
		return d.bind.primary.Features() // the GPU's, shared by its views
	}
	if d != nil {
		if f := d.features.Load(); f != nil {
			return *f, nil
		}
	}
	var f Features
	flags := []struct {
		dst  *bool
		attr DeviceAttribute
	}{
		{&f.MemoryPools, DeviceAttrMemoryPoolsSupported},
		{&f.VirtualMemory, DeviceAttrVirtualMemoryManagementSupported},
		{&f.PosixFDHandles, DeviceAttrHandleTypePosixFileDescriptorSupported},
		{&f.GPUDirectRDMA, DeviceAttrGPUDirectRDMASupported},
		{&f.GPUDirectRDMAWithVMM, DeviceAttrGPUDirectRDMAWithCUDAVMMSupported},
		{&f.ManagedMemory, DeviceAttrManagedMemory},
		{&f.ConcurrentManagedAccess, DeviceAttrConcurrentManagedAccess},
		{&f.PageableMemoryAccess, DeviceAttrPageableMemoryAccess},
	}
	for _, fl := range flags {
		v, err := d.Attribute(fl.attr)
		if err != nil {
			return f, err
		}
		*fl.dst = v != 0
	}
	if f.MemoryPools {
		v, err := d.Attribute(DeviceAttrMemPoolSupportedHandleTypes)
		if err != nil {
			return f, err
		}
		f.PoolIPC = MemHandleType(v)&MemHandleTypePosixFileDescriptor != 0
	}
	f.HostNUMAID = -1
	// A negative node from the driver means "unknown", whatever its value.
	v, err := d.Attribute(DeviceAttrHostNUMAID)
	if err == nil && v >= 0 {
		f.HostNUMAID = v
	}
	if err == nil {
		// Kept only when the best-effort read worked too: a transient
		// failure must not make the node unknown for good.
		kept := f
		d.features.Store(&kept)
	}
	return f, nil
}

// MemInfo returns the free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	ctx, err := d.contextFor("Device.MemInfo")
	if err != nil {
		return 0, 0, err
	}
	if r := d.drv.MemGetInfo.CallCtx(ctx, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))); !ok(r) {
		return 0, 0, fail(&d.drv.MemGetInfo, r)
	}
	return free, total, nil
}

// Sync waits for all work in the device's context to finish. While a
// stream of the context captures it is refused with an error matching
// ErrCapturing: the driver would invalidate the capture.
func (d *Device) Sync() error {
	ctx, err := d.contextFor("Device.Sync")
	if err != nil {
		return err
	}
	// The check and the wait are one step for a BeginCapture.
	if err := d.refuseContextWait("Device.Sync"); err != nil {
		return err
	}
	defer d.exitContextWait()
	return result(&d.drv.CtxSynchronize, d.drv.CtxSynchronize.CallCtx(ctx))
}

// EnablePeerAccess lets kernels and copies in this device's primary context
// use memory allocated with cuMemAlloc in peer's primary context. It is
// idempotent. (Pool and VMM memory have their own access controls.)
func (d *Device) EnablePeerAccess(peer *Device) error {
	if err := d.check("Device.EnablePeerAccess"); err != nil {
		return err
	}
	if !peer.valid() || peer.handle == d.handle {
		return Errorf("Device.EnablePeerAccess", ErrInvalidArgument, "peer %v is nil, zero or the device itself", peer)
	}
	ctx, err := d.contextFor("Device.EnablePeerAccess")
	if err != nil {
		return err
	}
	pctx, err := peer.contextFor("Device.EnablePeerAccess")
	if err != nil {
		return err
	}
	r := d.drv.CtxEnablePeerAccess.CallCtx(ctx, pctx, 0)
	if ok(r) || Result(int32(r)) == ErrorPeerAccessAlreadyEnabled {
		return nil
	}
	return fail(&d.drv.CtxEnablePeerAccess, r)
}

// DefaultStream returns the device's legacy default stream (handle 0 in
// the device's context: each view has its own), which synchronizes with
// every blocking stream of the context and cannot be closed. A nil Device
// returns nil, which every Stream method refuses.

func (d *Device) DefaultStream() *Stream {
	if d == nil {
		return nil
	}
	return &d.defaultStream
}
