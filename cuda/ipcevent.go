package cuda

import "errors"

// IPCEventHandle is a CUipcEventHandle: the opaque token
// cuIpcGetEventHandle makes of an interprocess event, for another process
// to wait on. PyTorch shares one with every CUDA tensor it sends, recorded
// after the work that produced the tensor.
type IPCEventHandle struct {
	Reserved [IPCHandleSize]byte
}

// IPCWaitEvent waits on the host until the interprocess event h names
// (made by another process) has completed, opening it in d's context and
// destroying this process's handle of it after. A process cannot open its
// own event handles. The handle bytes go to the driver as they are: take
// them only from a process this one trusts.
func (d *Device) IPCWaitEvent(h IPCEventHandle) error {
	const op = "Device.IPCWaitEvent"
	ctx, err := d.contextFor(op)
	if err != nil {
		return err
	}
	var ev uintptr
	pr := &d.drv.IpcOpenEventHandle
	if r := ipcOpenEvent(pr, ctx, &ev, &h); !ok(r) {
		return &OpError{Op: op, Err: fail(pr, r)}
	}
	werr := result(&d.drv.EventSynchronize, d.drv.EventSynchronize.CallCtx(ctx, ev))
	derr := result(&d.drv.EventDestroy, d.drv.EventDestroy.CallCtx(ctx, ev))
	if err := errors.Join(werr, derr); err != nil {
		return &OpError{Op: op, Err: err}
	}
	return nil
}
