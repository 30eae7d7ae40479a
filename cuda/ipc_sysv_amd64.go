//go:build !windows

package cuda

import (
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// ipcOpen calls cuIpcOpenMemHandle(CUdeviceptr*, CUipcMemHandle, unsigned).
// The System V amd64 ABI passes the 64-byte handle by value in memory: it
// occupies the first eight stack slots, while the pointer and the flags
// take the first two integer registers.
func ipcOpen(p *loader.Proc, ctx uintptr, out *DevicePtr, h *IPCMemHandle, flags IPCMemFlags) uintptr {
	w := (*[8]uintptr)(unsafe.Pointer(&h.Reserved))
	return p.CallCtx(ctx, uintptr(unsafe.Pointer(out)), uintptr(flags), 0, 0, 0, 0,
		w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
}
