package cuda

import (
	"fmt"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// This file holds the driver's virtual memory management calls (VMM):
// physical allocations (MemHandle), reserved address ranges, mappings and
// access. Package virtual builds growable allocations from them.

// refuseZeroHandle refuses physical allocation handle 0 for op before any
// driver call: no allocation has it, and the driver would take it as
// NULL (the package's rule for zero arguments).
func refuseZeroHandle(op string, h MemHandle) error {
	if h == 0 {
		return Errorf(op, ErrInvalidArgument, "physical allocation handle 0 (from MemCreate, MemImportFD, MemImportFabric or MemRetainAllocationHandle)")
	}
	return nil
}

// AllocationGranularity returns the size and alignment unit for cuMemCreate
// with these properties.
func (d *Device) AllocationGranularity(prop *MemAllocationProp, kind MemAllocationGranularity) (uint64, error) {
	ctx, err := d.contextFor("cuMemGetAllocationGranularity")
	if err != nil {
		return 0, err
	}
	if prop == nil {
		return 0, Errorf("cuMemGetAllocationGranularity", ErrInvalidArgument, "nil allocation properties")
	}
	var g uint64
	p := &d.drv.MemGetAllocationGranularity
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(prop)), uintptr(kind)); !ok(r) {
		return 0, fail(p, r)
	}
	// Callers align and divide by it: a zero (or not a power of two)
	// from the driver would become a division by zero or a misaligned
	// mapping there.
	if g == 0 || g&(g-1) != 0 {
		return 0, &OpError{Op: "cuMemGetAllocationGranularity", Err: fmt.Errorf("%w: the driver reported a granularity of %d bytes (not a power of two)", ErrorUnknown, g)}
	}
	return g, nil
}

// MemCreate allocates size bytes of physical memory (cuMemCreate); size must
// be a multiple of the granularity. Release the handle with MemRelease once
// it is unmapped (mappings keep the memory alive until then).
func (d *Device) MemCreate(size uint64, prop *MemAllocationProp) (MemHandle, error) {
	ctx, err := d.contextFor("cuMemCreate")
	if err != nil {
		return 0, err
	}
	if prop == nil {
		return 0, Errorf("cuMemCreate", ErrInvalidArgument, "nil allocation properties")
	}
	if size == 0 {
		return 0, Errorf("cuMemCreate", ErrInvalidArgument, "zero size")
	}
	var h MemHandle
	p := &d.drv.MemCreate
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(prop)), 0); !ok(r) {
		err := sizeErr(fail(p, r), size)
		if prop.RequestedHandleTypes&MemHandleTypeFabric != 0 {
			// Without IMEX the driver refuses fabric-shareable memory.
			err = FabricError("cuMemCreate", err)
		}
		return 0, err
	}
	if h == 0 {
		return 0, zeroHandleErr("cuMemCreate", "cuMemCreate", "physical allocation handle")
	}
	return h, nil
}

// MemRelease releases a physical allocation handle (cuMemRelease). Handle
// 0 is refused (ErrInvalidArgument) before the driver.
func (d *Device) MemRelease(h MemHandle) error {
	if err := refuseZeroHandle("cuMemRelease", h); err != nil {
		return err
	}
	return d.call("cuMemRelease", func(d *driver) *loader.Proc { return &d.MemRelease }, uintptr(h))
}

// MemAddressReserve reserves a virtual address range (cuMemAddressReserve).
// A non-zero hint asks for that address; the driver may return another.
func (d *Device) MemAddressReserve(size, alignment uint64, hint DevicePtr) (DevicePtr, error) {
	ctx, err := d.contextFor("cuMemAddressReserve")
	if err != nil {
		return 0, err
	}
	var ptr DevicePtr
	p := &d.drv.MemAddressReserve
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&ptr)), uintptr(size), uintptr(alignment), uintptr(hint), 0); !ok(r) {
		return 0, fmt.Errorf("reserve %d bytes at hint %#x: %w", size, uint64(hint), fail(p, r))
	}
	return ptr, nil
}

// MemAddressFree frees a reserved range (cuMemAddressFree).
func (d *Device) MemAddressFree(ptr DevicePtr, size uint64) error {
	return d.call("cuMemAddressFree", func(d *driver) *loader.Proc { return &d.MemAddressFree }, uintptr(ptr), uintptr(size))
}

// MemMap maps size bytes of h, from offset, at ptr (cuMemMap). Handle 0
// is refused (ErrInvalidArgument) before the driver.
func (d *Device) MemMap(ptr DevicePtr, size, offset uint64, h MemHandle) error {
	if err := refuseZeroHandle("cuMemMap", h); err != nil {
		return err
	}
	ctx, err := d.contextFor("cuMemMap")
	if err != nil {
		return err
	}
	p := &d.drv.MemMap
	if r := p.CallCtx(ctx, uintptr(ptr), uintptr(size), uintptr(offset), uintptr(h), 0); !ok(r) {
		return fmt.Errorf("map %d bytes at %#x: %w", size, uint64(ptr), fail(p, r))
	}
	return nil
}

// MemUnmap unmaps a range (cuMemUnmap).
func (d *Device) MemUnmap(ptr DevicePtr, size uint64) error {
	return d.call("cuMemUnmap", func(d *driver) *loader.Proc { return &d.MemUnmap }, uintptr(ptr), uintptr(size))
}

// MemSetAccess sets access to a mapped range for each location
// (cuMemSetAccess).
func (d *Device) MemSetAccess(ptr DevicePtr, size uint64, descs ...MemAccessDesc) error {
	ctx, err := d.contextFor("cuMemSetAccess")
	if err != nil {
		return err
	}
	if len(descs) == 0 {
		return Errorf("cuMemSetAccess", ErrInvalidArgument, "no access descriptors")
	}
	p := &d.drv.MemSetAccess
	if r := p.CallCtx(ctx, uintptr(ptr), uintptr(size), uintptr(unsafe.Pointer(&descs[0])), uintptr(len(descs))); !ok(r) {
		return fmt.Errorf("access %v to %d bytes at %#x: %w", descs, size, uint64(ptr), fail(p, r))
	}
	return nil
}

// MemGetAccess returns loc's access to the mapping at ptr (cuMemGetAccess).
func (d *Device) MemGetAccess(ptr DevicePtr, loc MemLocation) (MemAccessFlags, error) {
	ctx, err := d.contextFor("cuMemGetAccess")
	if err != nil {
		return 0, err
	}
	var f uint64
	p := &d.drv.MemGetAccess
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&loc)), uintptr(ptr)); !ok(r) {
		return 0, fail(p, r)
	}
	return MemAccessFlags(f), nil
}

// MemExportFD exports a physical allocation as a POSIX file descriptor
// (cuMemExportToShareableHandle); it must have been created with
// MemHandleTypePosixFileDescriptor requested. The caller owns the fd.
// Handle 0 is refused (ErrInvalidArgument) before the driver.
func (d *Device) MemExportFD(h MemHandle) (int, error) {
	if err := refuseZeroHandle("cuMemExportToShareableHandle", h); err != nil {
		return -1, err
	}
	ctx, err := d.contextFor("cuMemExportToShareableHandle")
	if err != nil {
		return -1, err
	}
	var fd int32 = -1
	p := &d.drv.MemExportToShareableHandle
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&fd)), uintptr(h), uintptr(MemHandleTypePosixFileDescriptor), 0); !ok(r) {
		return -1, fail(p, r)
	}
	return exportedFD("cuMemExportToShareableHandle", fd)
}

// MemImportFD imports a physical allocation from a POSIX file descriptor
// (cuMemImportFromShareableHandle). The fd stays the caller's to close.
func (d *Device) MemImportFD(fd int) (MemHandle, error) {
	if fd < 0 {
		return 0, Errorf("cuMemImportFromShareableHandle", ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	ctx, err := d.contextFor("cuMemImportFromShareableHandle")
	if err != nil {
		return 0, err
	}
	var h MemHandle
	p := &d.drv.MemImportFromShareableHandle
	// For POSIX fds the "OS handle" argument is the fd value itself.
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(fd), uintptr(MemHandleTypePosixFileDescriptor)); !ok(r) {
		return 0, fmt.Errorf("fd %d: %w", fd, fail(p, r))
	}
	if h == 0 {
		return 0, zeroHandleErr("cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", fmt.Sprintf("physical allocation handle (fd %d)", fd))
	}
	return h, nil
}

// MemRetainAllocationHandle returns (and retains: release it) the physical
// allocation mapped at addr (cuMemRetainAllocationHandle).
func (d *Device) MemRetainAllocationHandle(addr DevicePtr) (MemHandle, error) {
	ctx, err := d.contextFor("cuMemRetainAllocationHandle")
	if err != nil {
		return 0, err
	}
	var h MemHandle
	p := &d.drv.MemRetainAllocationHandle
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(addr)); !ok(r) {
		return 0, fail(p, r)
	}
	if h == 0 {
		return 0, zeroHandleErr("cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", fmt.Sprintf("physical allocation handle (address %#x)", uint64(addr)))
	}
	return h, nil
}

// MemAllocationProperties returns the properties a handle was created with
// (cuMemGetAllocationPropertiesFromHandle). Handle 0 is refused
// (ErrInvalidArgument) before the driver.
func (d *Device) MemAllocationProperties(h MemHandle) (MemAllocationProp, error) {
	var prop MemAllocationProp
	if err := refuseZeroHandle("cuMemGetAllocationPropertiesFromHandle", h); err != nil {
		return prop, err
	}
	ctx, err := d.contextFor("cuMemGetAllocationPropertiesFromHandle")
	if err != nil {
		return prop, err
	}
	p := &d.drv.MemGetAllocationPropertiesFromHandle
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&prop)), uintptr(h)); !ok(r) {
		return prop, fail(p, r)
	}
	return prop, nil
}
