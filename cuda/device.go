package cuda

import (
	"bytes"
	"fmt"
	"sync"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// Device is one CUDA device, identified by its ordinal. Devices are
// singletons: GetDevice returns the same *Device for an ordinal every time,
// and it is safe for concurrent use.
//
// Every call that needs a CUDA context uses the device's primary context,
// retained on first use and kept for the life of the process, and makes it
// current on the OS thread that runs the driver call, inside that call.
type Device struct {
	ordinal int
	handle  int32 // CUdevice
	drv     *loader.Driver

	ctxOnce sync.Once
	ctx     uintptr // CUcontext (primary), 0 until retained
	ctxErr  error

	defaultStream Stream
}

var devices = sync.OnceValues(func() ([]*Device, error) {
	d, err := load()
	if err != nil {
		return nil, err
	}
	var n int32
	if r := d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))); !ok(r) {
		return nil, fail(&d.DeviceGetCount, r)
	}
	out := make([]*Device, n)
	for i := range out {
		var h int32
		if r := d.DeviceGet.Call(uintptr(unsafe.Pointer(&h)), uintptr(i)); !ok(r) {
			return nil, fail(&d.DeviceGet, r)
		}
		dev := &Device{ordinal: i, handle: h, drv: d}
		dev.defaultStream = Stream{dev: dev}
		out[i] = dev
	}
	return out, nil
})

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

// Ordinal is the device's ordinal (0, 1, ...).
func (d *Device) Ordinal() int { return d.ordinal }

// String returns "GPU <ordinal>".
func (d *Device) String() string { return fmt.Sprintf("GPU %d", d.ordinal) }

// context returns the retained primary context.
func (d *Device) context() (uintptr, error) {
	d.ctxOnce.Do(func() {
		var c uintptr
		if r := d.drv.DevicePrimaryCtxRetain.Call(uintptr(unsafe.Pointer(&c)), uintptr(d.handle)); !ok(r) {
			d.ctxErr = fail(&d.drv.DevicePrimaryCtxRetain, r)
			return
		}
		d.ctx = c
	})
	return d.ctx, d.ctxErr
}

// Context returns the device's primary CUcontext handle, retaining it on
// first use. It is for interoperating with other CUDA code; cudamem makes
// it current by itself where needed.
func (d *Device) Context() (uintptr, error) { return d.context() }

// Name returns the device's product name.
func (d *Device) Name() (string, error) {
	var buf [256]byte
	if r := d.drv.DeviceGetName.Call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d.handle)); !ok(r) {
		return "", fail(&d.drv.DeviceGetName, r)
	}
	if i := bytes.IndexByte(buf[:], 0); i >= 0 {
		return string(buf[:i]), nil
	}
	return string(buf[:]), nil
}

// UUID returns the device's UUID, as nvidia-smi -L prints it.
func (d *Device) UUID() (UUID, error) {
	var u UUID
	if r := d.drv.DeviceGetUuid.Call(uintptr(unsafe.Pointer(&u)), uintptr(d.handle)); !ok(r) {
		return u, fail(&d.drv.DeviceGetUuid, r)
	}
	return u, nil
}

// PCIBusID returns the device's PCI bus ID (domain:bus:device.function).
func (d *Device) PCIBusID() (string, error) {
	var buf [64]byte
	if r := d.drv.DeviceGetPCIBusId.Call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d.handle)); !ok(r) {
		return "", fail(&d.drv.DeviceGetPCIBusId, r)
	}
	if i := bytes.IndexByte(buf[:], 0); i >= 0 {
		return string(buf[:i]), nil
	}
	return string(buf[:]), nil
}

// TotalMemory returns the device's memory size in bytes.
func (d *Device) TotalMemory() (uint64, error) {
	var n uint64
	if r := d.drv.DeviceTotalMem.Call(uintptr(unsafe.Pointer(&n)), uintptr(d.handle)); !ok(r) {
		return 0, fail(&d.drv.DeviceTotalMem, r)
	}
	return n, nil
}

// Attribute returns a device attribute.
func (d *Device) Attribute(a DeviceAttribute) (int, error) {
	var v int32
	if r := d.drv.DeviceGetAttribute.Call(uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(d.handle)); !ok(r) {
		return 0, fmt.Errorf("device attribute %v: %w", a, fail(&d.drv.DeviceGetAttribute, r))
	}
	return int(v), nil
}

// ComputeCapability returns the device's compute capability (9, 0 for an
// H100 or H200).
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
	if peer == nil {
		return false, Errorf("Device.CanAccessPeer", ErrInvalidArgument, "nil peer device")
	}
	if peer == d {
		return false, nil
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

// Features queries the device's memory features.
func (d *Device) Features() (Features, error) {
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
	if v, err := d.Attribute(DeviceAttrHostNUMAID); err == nil {
		f.HostNUMAID = v
	}
	return f, nil
}

// MemInfo returns the free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	ctx, err := d.context()
	if err != nil {
		return 0, 0, err
	}
	if r := d.drv.MemGetInfo.CallCtx(ctx, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))); !ok(r) {
		return 0, 0, fail(&d.drv.MemGetInfo, r)
	}
	return free, total, nil
}

// Sync waits for all work on the device (in its primary context) to finish.
func (d *Device) Sync() error {
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return result(&d.drv.CtxSynchronize, d.drv.CtxSynchronize.CallCtx(ctx))
}

// EnablePeerAccess lets kernels and copies in this device's primary context
// use memory allocated with cuMemAlloc in peer's primary context. It is
// idempotent. (Pool and VMM memory have their own access controls.)
func (d *Device) EnablePeerAccess(peer *Device) error {
	if peer == nil || peer == d {
		return Errorf("Device.EnablePeerAccess", ErrInvalidArgument, "peer %v is nil or the device itself", peer)
	}
	ctx, err := d.context()
	if err != nil {
		return err
	}
	pctx, err := peer.context()
	if err != nil {
		return err
	}
	r := d.drv.CtxEnablePeerAccess.CallCtx(ctx, pctx, 0)
	if ok(r) || Result(int32(r)) == ErrorPeerAccessAlreadyEnabled {
		return nil
	}
	return fail(&d.drv.CtxEnablePeerAccess, r)
}

// DefaultStream returns the device's legacy default stream (handle 0 in the
// primary context). It synchronizes with every blocking stream of the
// context; it cannot be closed.
func (d *Device) DefaultStream() *Stream { return &d.defaultStream }

// currentContext returns the context current on the OS thread that runs
// the call. Tests of the context model use it; cudamem never relies on it.
func currentContext(d *Device) (uintptr, error) {
	var c uintptr
	if r := d.drv.CtxGetCurrent.Call(uintptr(unsafe.Pointer(&c))); !ok(r) {
		return 0, fail(&d.drv.CtxGetCurrent, r)
	}
	return c, nil
}
