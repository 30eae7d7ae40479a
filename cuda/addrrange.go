package cuda

import "unsafe"

// MemGetAddressRange returns the allocation that contains p
// (cuMemGetAddressRange): its base address and size. For memory mapped
// from another process (pool imports, legacy IPC handles) this is what
// the driver actually mapped here, the bound an importer must keep every
// buffer within.
func (d *Device) MemGetAddressRange(p DevicePtr) (base DevicePtr, size uint64, err error) {
	const op = "Device.MemGetAddressRange"
	if err := d.check(op); err != nil {
		return 0, 0, err
	}
	if p == 0 {
		return 0, 0, Errorf(op, ErrInvalidArgument, "null device pointer")
	}
	ctx, err := d.context()
	if err != nil {
		return 0, 0, err
	}
	ar := &d.drv.MemGetAddressRange
	if r := ar.CallCtx(ctx, uintptr(unsafe.Pointer(&base)), uintptr(unsafe.Pointer(&size)), uintptr(p)); !ok(r) {
		return 0, 0, fail(ar, r)
	}
	return base, size, nil
}
