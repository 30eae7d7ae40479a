//go:build windows || !amd64

package cuda

import (
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// ipcOpen calls cuIpcOpenMemHandle(CUdeviceptr*, CUipcMemHandle, unsigned).
// On arm64 (AAPCS64) and Windows x64 a struct of more than 16 (8) bytes
// passed by value travels as a pointer to a caller-owned copy.
func ipcOpen(p *loader.Proc, ctx uintptr, out *DevicePtr, h *IPCMemHandle, flags IPCMemFlags) uintptr {
	c := *h // the callee may modify its copy
	return p.CallCtx(ctx, uintptr(unsafe.Pointer(out)), uintptr(unsafe.Pointer(&c)), uintptr(flags))
}
