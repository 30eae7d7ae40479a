//go:build linux

package dlpack_test

import (
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
)

// A host tensor whose first and last pages are mapped but whose middle
// page is not is refused (found in review: only the two ends were
// checked, and a later read of the Buffer crashed the process).
func TestImportRefusesHoleInHostTensor(t *testing.T) {
	needSupported(t)
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	require.NoError(t, err)
	base := uintptr(unsafe.Pointer(&mem[0]))
	_, _, e := syscall.Syscall(syscall.SYS_MUNMAP, base+uintptr(page), uintptr(page), 0)
	require.Zero(t, e)
	t.Cleanup(func() {
		syscall.Syscall(syscall.SYS_MUNMAP, base, uintptr(page), 0)
		syscall.Syscall(syscall.SYS_MUNMAP, base+2*uintptr(page), uintptr(page), 0)
	})
	h := newHostile()
	// Pinned: Import reads h through its address alone, which a stack
	// copy would leave behind.
	var pin runtime.Pinner
	pin.Pin(h)
	defer pin.Unpin()
	h.m.Tensor.Data = base
	h.shape[0] = int64(3 * page)
	_, err = dlpack.Import(addr(&h.m))
	require.Error(t, err)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "not all mapped")

	h.shape[0] = int64(page) // the first page alone is fine
	b, err := dlpack.Import(addr(&h.m))
	require.NoError(t, err)
	require.NoError(t, b.Close())
}
