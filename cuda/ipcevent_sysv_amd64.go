//go:build !windows

package cuda

import (
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// ipcOpenEvent calls cuIpcOpenEventHandle(CUevent*, CUipcEventHandle). As
// for ipcOpen, the System V amd64 ABI passes the 64-byte handle by value
// in memory (the first eight stack slots); the pointer takes the first
// integer register, and the other five are unused.
func ipcOpenEvent(p *loader.Proc, ctx uintptr, out *uintptr, h *IPCEventHandle) uintptr {
	w := (*[8]uintptr)(unsafe.Pointer(&h.Reserved))
	return p.CallCtx(ctx, uintptr(unsafe.Pointer(out)), 0, 0, 0, 0, 0,
		w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
}
