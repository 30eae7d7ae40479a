//go:build windows || !amd64

package cuda

import (
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// ipcOpenEvent calls cuIpcOpenEventHandle(CUevent*, CUipcEventHandle).
// As for ipcOpen, on arm64 (AAPCS64) and Windows x64 the 64-byte struct
// passed by value travels as a pointer to a caller-owned copy.
func ipcOpenEvent(p *loader.Proc, ctx uintptr, out *uintptr, h *IPCEventHandle) uintptr {
	c := *h // the callee may modify its copy
	return p.CallCtx(ctx, uintptr(unsafe.Pointer(out)), uintptr(unsafe.Pointer(&c)))
}
