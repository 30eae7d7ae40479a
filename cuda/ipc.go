package cuda

import "unsafe"

// IPCGetMemHandle returns a legacy IPC handle for memory from MemAlloc
// (cuIpcGetMemHandle), as CuPy and PyTorch share memory. Pool memory uses
// MemPool.ExportPointer instead.
func (d *Device) IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	var h IPCMemHandle
	ctx, err := d.contextFor("Device.IPCGetMemHandle")
	if err != nil {
		return h, err
	}
	pr := &d.drv.IpcGetMemHandle
	if r := pr.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(p)); !ok(r) {
		return h, fail(pr, r)
	}
	return h, nil
}

// IPCOpenMemHandle maps memory another process exported with
// IPCGetMemHandle (cuIpcOpenMemHandle). Unmap it with IPCCloseMemHandle.
// A process cannot open its own handles.
func (d *Device) IPCOpenMemHandle(h IPCMemHandle, flags IPCMemFlags) (DevicePtr, error) {
	ctx, err := d.contextFor("Device.IPCOpenMemHandle")
	if err != nil {
		return 0, err
	}
	var p DevicePtr
	pr := &d.drv.IpcOpenMemHandle
	if r := ipcOpen(pr, ctx, &p, &h, flags); !ok(r) {
		return 0, fail(pr, r)
	}
	return p, nil
}

// IPCCloseMemHandle unmaps memory opened with IPCOpenMemHandle.
func (d *Device) IPCCloseMemHandle(p DevicePtr) error {
	ctx, err := d.contextFor("Device.IPCCloseMemHandle")
	if err != nil {
		return err
	}
	return result(&d.drv.IpcCloseMemHandle, d.drv.IpcCloseMemHandle.CallCtx(ctx, uintptr(p)))
}
