package cuda

import (
	"fmt"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// MemPool is a CUmemoryPool handle: the driver's stream-ordered allocator
// for one location (a device, or host memory). It is a plain value with no
// lifetime management: package resource owns pools and destroys them.
type MemPool struct {
	handle uintptr
	dev    *Device // supplies the context for calls on the pool
}

// Handle is the CUmemoryPool handle.
func (p MemPool) Handle() uintptr { return p.handle }

// Device is the device whose context serves calls on the pool.
func (p MemPool) Device() *Device { return p.dev }

// IsZero reports whether p is the zero MemPool.
func (p MemPool) IsZero() bool { return p.handle == 0 }

func (p MemPool) drv() *driver { return p.dev.drv }

func (p MemPool) ctx(op string) (uintptr, error) {
	if p.handle == 0 || !p.dev.valid() {
		return 0, Errorf(op, ErrInvalidArgument, "zero memory pool")
	}
	return p.dev.context()
}

// DefaultMemPool returns the device's default memory pool.
func (d *Device) DefaultMemPool() (MemPool, error) {
	return d.getPool("Device.DefaultMemPool", func(d *driver) *loader.Proc { return &d.DeviceGetDefaultMemPool })
}

// CurrentMemPool returns the pool cuMemAllocAsync currently uses on the
// device (the default pool unless SetMemPool changed it).
func (d *Device) CurrentMemPool() (MemPool, error) {
	return d.getPool("Device.CurrentMemPool", func(d *driver) *loader.Proc { return &d.DeviceGetMemPool })
}

// getPool asks proc(d.drv) for a pool of d (op names a failed check).
func (d *Device) getPool(op string, proc func(*driver) *loader.Proc) (MemPool, error) {
	if err := d.check(op); err != nil {
		return MemPool{}, err
	}
	var h uintptr
	p := proc(d.drv)
	if r := p.Call(uintptr(unsafe.Pointer(&h)), uintptr(d.handle)); !ok(r) {
		return MemPool{}, fail(p, r)
	}
	return MemPool{handle: h, dev: d}, nil
}

// SetMemPool makes p the pool cuMemAllocAsync uses on the device.
func (d *Device) SetMemPool(p MemPool) error {
	if err := d.check("cuDeviceSetMemPool"); err != nil {
		return err
	}
	if _, err := p.ctx("cuDeviceSetMemPool"); err != nil {
		return err
	}
	return result(&d.drv.DeviceSetMemPool, d.drv.DeviceSetMemPool.Call(uintptr(d.handle), p.handle))
}

// DefaultHostMemPool returns the driver's default pool for pinned host
// memory at loc (a host or host NUMA location; CUDA 13.0 drivers).
func (d *Device) DefaultHostMemPool(loc MemLocation) (MemPool, error) {
	ctx, err := d.contextFor("Device.DefaultHostMemPool")
	if err != nil {
		return MemPool{}, err
	}
	var h uintptr
	p := &d.drv.MemGetDefaultMemPool
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&loc)), uintptr(MemAllocationTypePinned)); !ok(r) {
		return MemPool{}, fail(p, r)
	}
	return MemPool{handle: h, dev: d}, nil
}

// CurrentMemPoolAt returns the pool the driver allocates memory of type t
// at loc from (cuMemGetMemPool, CUDA 13.0): the last one set for them, or
// their default pool. For managed memory, loc may be the zero MemLocation
// (no preferred location). A driver without the call gives an error
// matching ErrNotSupported.
func (d *Device) CurrentMemPoolAt(loc MemLocation, t MemAllocationType) (MemPool, error) {
	ctx, err := d.contextFor("Device.CurrentMemPoolAt")
	if err != nil {
		return MemPool{}, err
	}
	var h uintptr
	p := &d.drv.MemGetMemPool
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&loc)), uintptr(t)); !ok(r) {
		return MemPool{}, fmt.Errorf("location %s, allocation type %d: %w", loc, t, fail(p, r))
	}
	if h == 0 {
		return MemPool{}, zeroHandleErr("Device.CurrentMemPoolAt", "cuMemGetMemPool", "memory pool")
	}
	return MemPool{handle: h, dev: d}, nil
}

// CreateMemPool creates a pool with the given properties (cuMemPoolCreate).
// The device's context serves later calls on the pool; the pool's memory
// lives where props.Location says.
//
// A pool with fabric handles (MemHandleTypeFabric) is made only where
// CheckFabricAt passes at its location: otherwise the error matches
// ErrNotSupported and names IMEX, since the driver can make a pool it then
// cannot export, and crash the process when it is destroyed.
func (d *Device) CreateMemPool(props *MemPoolProps) (MemPool, error) {
	if err := d.check("cuMemPoolCreate"); err != nil {
		return MemPool{}, err
	}
	if props == nil {
		return MemPool{}, Errorf("cuMemPoolCreate", ErrInvalidArgument, "nil properties")
	}
	ctx, err := d.contextFor("Device.CreateMemPool")
	if err != nil {
		return MemPool{}, err
	}
	if props.HandleTypes&MemHandleTypeFabric != 0 {
		// Probed at the pool's own location: one on the device says
		// nothing about host memory.
		if err := d.CheckFabricAt(props.Location); err != nil {
			return MemPool{}, &OpError{Op: "cuMemPoolCreate", Err: fmt.Errorf("location %s, handle types %#x: %w",
				locationName(props.Location), props.HandleTypes, err)}
		}
	}
	var h uintptr
	r := d.drv.MemPoolCreate.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(props)))
	if !ok(r) {
		err := fmt.Errorf("location %v/%d, handle types %#x, max size %d: %w",
			props.Location.Type, props.Location.ID, props.HandleTypes, props.MaxSize, fail(&d.drv.MemPoolCreate, r))
		if props.HandleTypes&MemHandleTypeFabric != 0 {
			err = FabricError("cuMemPoolCreate", err) // refused without IMEX
		}
		return MemPool{}, err
	}
	if h == 0 {
		return MemPool{}, zeroHandleErr("Device.CreateMemPool", "cuMemPoolCreate", "memory pool")
	}
	return MemPool{handle: h, dev: d}, nil
}

// ImportMemPoolFD imports a pool exported by another process as a POSIX
// file descriptor (cuMemPoolImportFromShareableHandle). The fd stays the
// caller's to close.
func (d *Device) ImportMemPoolFD(fd int) (MemPool, error) {
	if fd < 0 {
		return MemPool{}, Errorf("cuMemPoolImportFromShareableHandle", ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	ctx, err := d.contextFor("Device.ImportMemPoolFD")
	if err != nil {
		return MemPool{}, err
	}
	var h uintptr
	p := &d.drv.MemPoolImportFromShareableHandle
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(fd), uintptr(MemHandleTypePosixFileDescriptor), 0); !ok(r) {
		return MemPool{}, fmt.Errorf("fd %d: %w", fd, fail(p, r))
	}
	if h == 0 {
		return MemPool{}, zeroHandleErr("Device.ImportMemPoolFD", "cuMemPoolImportFromShareableHandle", "memory pool")
	}
	return MemPool{handle: h, dev: d}, nil
}

// Destroy destroys the pool (cuMemPoolDestroy). Memory still allocated from
// it is released once freed.
func (p MemPool) Destroy() error {
	ctx, err := p.ctx("cuMemPoolDestroy")
	if err != nil {
		return err
	}
	return result(&p.drv().MemPoolDestroy, p.drv().MemPoolDestroy.CallCtx(ctx, p.handle))
}

// isIntAttr reports whether a pool attribute is a C int rather than a
// 64-bit value.
func isIntAttr(a MemPoolAttribute) bool {
	switch a {
	case MemPoolAttrReuseFollowEventDependencies, MemPoolAttrReuseAllowOpportunistic, MemPoolAttrReuseAllowInternalDependencies:
		return true
	}
	return false
}

// Attribute reads a pool attribute as a 64-bit value (flags are 0 or 1).
func (p MemPool) Attribute(a MemPoolAttribute) (uint64, error) {
	ctx, err := p.ctx("cuMemPoolGetAttribute")
	if err != nil {
		return 0, err
	}
	var v uint64 // an int attribute fills the low 4 bytes (little-endian)
	pr := &p.drv().MemPoolGetAttribute
	if r := pr.CallCtx(ctx, p.handle, uintptr(a), uintptr(unsafe.Pointer(&v))); !ok(r) {
		return 0, fmt.Errorf("pool attribute %v: %w", a, fail(pr, r))
	}
	if isIntAttr(a) {
		v = uint64(uint32(v))
	}
	return v, nil
}

// SetAttribute writes a pool attribute. The driver allows setting the reuse
// flags and the release threshold, and resetting the *High attributes to 0.
func (p MemPool) SetAttribute(a MemPoolAttribute, v uint64) error {
	ctx, err := p.ctx("cuMemPoolSetAttribute")
	if err != nil {
		return err
	}
	pr := &p.drv().MemPoolSetAttribute
	var r uintptr
	if isIntAttr(a) {
		if v > 1 {
			return Errorf("cuMemPoolSetAttribute", ErrInvalidArgument, "pool attribute %v is a flag: value %d is not 0 or 1", a, v)
		}
		iv := int32(v)
		r = pr.CallCtx(ctx, p.handle, uintptr(a), uintptr(unsafe.Pointer(&iv)))
	} else {
		r = pr.CallCtx(ctx, p.handle, uintptr(a), uintptr(unsafe.Pointer(&v)))
	}
	if !ok(r) {
		return fmt.Errorf("pool attribute %v = %d: %w", a, v, fail(pr, r))
	}
	return nil
}

// TrimTo releases unused pool memory back to the system until the pool
// holds at most keep bytes of reserved memory (cuMemPoolTrimTo).
func (p MemPool) TrimTo(keep uint64) error {
	ctx, err := p.ctx("cuMemPoolTrimTo")
	if err != nil {
		return err
	}
	return result(&p.drv().MemPoolTrimTo, p.drv().MemPoolTrimTo.CallCtx(ctx, p.handle, uintptr(keep)))
}

// SetAccess sets how the given locations (typically peer devices) may
// access the pool's memory (cuMemPoolSetAccess).
func (p MemPool) SetAccess(descs ...MemAccessDesc) error {
	ctx, err := p.ctx("cuMemPoolSetAccess")
	if err != nil {
		return err
	}
	if len(descs) == 0 {
		return nil
	}
	pr := &p.drv().MemPoolSetAccess
	r := pr.CallCtx(ctx, p.handle, uintptr(unsafe.Pointer(&descs[0])), uintptr(len(descs)))
	if !ok(r) {
		return fmt.Errorf("access %v: %w", descs, fail(pr, r))
	}
	return nil
}

// Access returns how loc may access the pool's memory (cuMemPoolGetAccess).
func (p MemPool) Access(loc MemLocation) (MemAccessFlags, error) {
	ctx, err := p.ctx("cuMemPoolGetAccess")
	if err != nil {
		return 0, err
	}
	var f MemAccessFlags
	pr := &p.drv().MemPoolGetAccess
	if r := pr.CallCtx(ctx, uintptr(unsafe.Pointer(&f)), p.handle, uintptr(unsafe.Pointer(&loc))); !ok(r) {
		return 0, fail(pr, r)
	}
	return f, nil
}

// ExportFD exports the pool as a new POSIX file descriptor
// (cuMemPoolExportToShareableHandle). The pool must have been created with
// MemHandleTypePosixFileDescriptor; the caller owns and closes the fd.
func (p MemPool) ExportFD() (int, error) {
	ctx, err := p.ctx("cuMemPoolExportToShareableHandle")
	if err != nil {
		return -1, err
	}
	var fd int32 = -1
	pr := &p.drv().MemPoolExportToShareableHandle
	if r := pr.CallCtx(ctx, uintptr(unsafe.Pointer(&fd)), p.handle, uintptr(MemHandleTypePosixFileDescriptor), 0); !ok(r) {
		return -1, fail(pr, r)
	}
	return exportedFD("cuMemPoolExportToShareableHandle", fd)
}

// ExportPointer describes an allocation of an exportable pool for another
// process (cuMemPoolExportPointer).
func (p MemPool) ExportPointer(ptr DevicePtr) (MemPoolPtrExportData, error) {
	var data MemPoolPtrExportData
	ctx, err := p.ctx("cuMemPoolExportPointer")
	if err != nil {
		return data, err
	}
	pr := &p.drv().MemPoolExportPointer
	if r := pr.CallCtx(ctx, uintptr(unsafe.Pointer(&data)), uintptr(ptr)); !ok(r) {
		return data, fail(pr, r)
	}
	return data, nil
}

// ImportPointer maps an allocation exported by another process from this
// (imported) pool (cuMemPoolImportPointer). Free it with MemFreeAsync.
func (p MemPool) ImportPointer(data *MemPoolPtrExportData) (DevicePtr, error) {
	ctx, err := p.ctx("cuMemPoolImportPointer")
	if err != nil {
		return 0, err
	}
	if data == nil {
		return 0, Errorf("cuMemPoolImportPointer", ErrInvalidArgument, "nil export data")
	}
	var ptr DevicePtr
	pr := &p.drv().MemPoolImportPointer
	if r := pr.CallCtx(ctx, uintptr(unsafe.Pointer(&ptr)), p.handle, uintptr(unsafe.Pointer(data))); !ok(r) {
		return 0, fail(pr, r)
	}
	return ptr, nil
}

// exportedFD checks the descriptor a successful export returned: a driver
// that reports success with a negative fd would otherwise hand callers a
// value that closes or reads the wrong file.
func exportedFD(op string, fd int32) (int, error) {
	if fd < 0 {
		return -1, &OpError{Op: op, Err: fmt.Errorf("%w: the driver reported success with file descriptor %d", ErrorUnknown, fd)}
	}
	return int(fd), nil
}
