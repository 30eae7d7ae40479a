//go:build linux && (amd64 || arm64)

package dlpack

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unmappedPage returns the address of a page that was mapped and is not
// any more: reading it must fail, never crash.
func unmappedPage(t *testing.T) uintptr {
	b, err := syscall.Mmap(-1, 0, 2*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	p := uintptr(unsafe.Pointer(&b[0]))
	require.NoError(t, syscall.Munmap(b))
	return p
}

func TestReadMem(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		forcePipe = pipe
		src := make([]byte, 10000)
		for i := range src {
			src[i] = byte(i * 7)
		}
		dst := make([]byte, len(src))
		require.NoError(t, readMem(dst, uintptr(unsafe.Pointer(&src[0]))))
		assert.Equal(t, src, dst, "pipe %v", pipe)
		assert.NoError(t, readMem(nil, 0), "nothing to read")

		gone := unmappedPage(t)
		assert.ErrorIs(t, readMem(make([]byte, 8), gone), syscall.EFAULT, "pipe %v", pipe)
		assert.Error(t, readMem(make([]byte, 8), 0))
		assert.Error(t, readMem(make([]byte, 8), ^uintptr(3)), "wraps")

		// A range that starts mapped and runs into the unmapped page.
		b, err := syscall.Mmap(-1, 0, 2*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		require.NoError(t, err)
		base := uintptr(unsafe.Pointer(&b[0]))
		_, _, errno := syscall.Syscall(syscall.SYS_MUNMAP, base+4096, 4096, 0)
		require.Zero(t, errno)
		assert.NoError(t, readMem(make([]byte, 16), base+4096-16))
		assert.ErrorIs(t, readMem(make([]byte, 32), base+4096-16), syscall.EFAULT, "pipe %v", pipe)
		_, _, errno = syscall.Syscall(syscall.SYS_MUNMAP, base, 4096, 0)
		require.Zero(t, errno)
	}
	forcePipe = false
}
