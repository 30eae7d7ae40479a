//go:build linux

package dlpack_test

import (
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
)

// Host tensors over memory that a load or a store would fault on are
// refused at Import, with an error matching cuda.ErrInvalidArgument: the
// Buffer's first ReadAt (or write) would otherwise kill the process. mincore
// alone said "mapped" for PROT_NONE and read-only pages alike.

// mmapPages maps n anonymous read-write pages, unmapped at the end of the
// test (only the pages still mapped then).
func mmapPages(t *testing.T, n int) (base uintptr, page int) {
	t.Helper()
	page = syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, n*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	require.NoError(t, err)
	base = uintptr(unsafe.Pointer(&mem[0]))
	for i := range mem {
		mem[i] = byte(i / page) // page i holds i
	}
	t.Cleanup(func() {
		for i := range n { // munmap of a page already unmapped is harmless
			syscall.Syscall(syscall.SYS_MUNMAP, base+uintptr(i*page), uintptr(page), 0)
		}
	})
	return base, page
}

func mprotect(t *testing.T, addr uintptr, n, prot int) {
	t.Helper()
	_, _, e := syscall.Syscall(syscall.SYS_MPROTECT, addr, uintptr(n), uintptr(prot))
	require.Zero(t, e, "mprotect")
}

func munmap(t *testing.T, addr uintptr, n int) {
	t.Helper()
	_, _, e := syscall.Syscall(syscall.SYS_MUNMAP, addr, uintptr(n), 0)
	require.Zero(t, e, "munmap")
}

// hostTensor is a pinned hostile tensor (no deleter) over n bytes at data:
// Import reads it through its address alone, which a stack copy would
// leave behind.
func hostTensor(t *testing.T, data uintptr, n int) *hostile {
	h := newHostile()
	var pin runtime.Pinner
	pin.Pin(h)
	t.Cleanup(pin.Unpin)
	h.m.Tensor.Data = data
	h.shape[0] = int64(n)
	return h
}

func TestImportRefusesUnusableHostMemory(t *testing.T) {
	needSupported(t)
	for _, c := range []struct {
		name string
		make func(t *testing.T, base uintptr, page int) // on three read-write pages
		want string                                     // in the error
	}{
		{"PROT_NONE", func(t *testing.T, base uintptr, page int) { mprotect(t, base, 3*page, syscall.PROT_NONE) },
			"without read"},
		{"PROT_NONE middle page", func(t *testing.T, base uintptr, page int) {
			mprotect(t, base+uintptr(page), page, syscall.PROT_NONE)
		}, "without read"},
		{"PROT_NONE last page", func(t *testing.T, base uintptr, page int) {
			mprotect(t, base+2*uintptr(page), page, syscall.PROT_NONE)
		}, "without read"},
		{"unmapped middle page", func(t *testing.T, base uintptr, page int) { munmap(t, base+uintptr(page), page) },
			"nothing is mapped"},
		{"PROT_READ", func(t *testing.T, base uintptr, page int) { mprotect(t, base, 3*page, syscall.PROT_READ) },
			"without write permission"},
		{"read-only middle page", func(t *testing.T, base uintptr, page int) {
			mprotect(t, base+uintptr(page), page, syscall.PROT_READ)
		}, "without write permission"},
	} {
		t.Run(c.name, func(t *testing.T) {
			base, page := mmapPages(t, 3)
			c.make(t, base, page)
			h := hostTensor(t, base, 3*page)
			_, err := dlpack.Import(addr(&h.m))
			require.Error(t, err)
			assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.ErrorContains(t, err, "dlpack.Import")
			assert.ErrorContains(t, err, c.want)

			// The first page alone is usable in every case but one.
			h.shape[0] = int64(page)
			b, err := dlpack.Import(addr(&h.m))
			if c.name == "PROT_NONE" || c.name == "PROT_READ" {
				require.Error(t, err, "the first page is no better")
				return
			}
			require.NoError(t, err)
			got := make([]byte, page)
			n, err := b.ReadAt(got, 0)
			require.NoError(t, err)
			assert.Equal(t, page, n)
			assert.Equal(t, byte(0), got[page-1])
			require.NoError(t, b.Close())
		})
	}
}

// A read-only mapping is refused for a tensor that does not say it is
// read-only, and accepted when the caller promises not to write
// (AllowReadOnly), whatever the tensor's flag; the Buffer then reads it.
func TestImportReadOnlyMapping(t *testing.T) {
	needSupported(t)
	base, page := mmapPages(t, 2)
	mprotect(t, base, 2*page, syscall.PROT_READ)
	h := hostTensor(t, base, 2*page)
	_, err := dlpack.Import(addr(&h.m))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorContains(t, err, "not flagged read-only")
	assert.ErrorContains(t, err, "AllowReadOnly")
	_, err = dlpack.ImportUnversioned(addr(&h.m.Tensor))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "an unversioned tensor cannot say read-only")

	for _, flags := range []uint64{0, dlpack.FlagReadOnly} {
		h.m.Flags = flags
		b, err := dlpack.Import(addr(&h.m), dlpack.AllowReadOnly())
		require.NoError(t, err, "flags %#x", flags)
		got := make([]byte, 2*page)
		_, err = b.ReadAt(got, 0)
		require.NoError(t, err)
		assert.Equal(t, byte(1), got[2*page-1])
		require.NoError(t, b.Close())
	}
	h.m.Flags = dlpack.FlagReadOnly
	_, err = dlpack.Import(addr(&h.m))
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "a read-only tensor still needs AllowReadOnly")
}

// A file mapping whose file was truncated maps pages past the file's end:
// the maps file shows them as ordinary readable pages, and a load from
// them raises SIGBUS. The page probe finds them.
func TestImportRefusesPagesPastEndOfFile(t *testing.T) {
	needSupported(t)
	page := syscall.Getpagesize()
	f, err := os.Create(filepath.Join(t.TempDir(), "tensor"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(int64(3*page)))
	mem, err := syscall.Mmap(int(f.Fd()), 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	require.NoError(t, err)
	defer syscall.Munmap(mem)
	base := uintptr(unsafe.Pointer(&mem[0]))
	h := hostTensor(t, base, 3*page)
	b, err := dlpack.Import(addr(&h.m))
	require.NoError(t, err, "the whole file is there")
	require.NoError(t, b.Close())

	require.NoError(t, f.Truncate(int64(page)))
	_, err = dlpack.Import(addr(&h.m))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorContains(t, err, "cannot be read")
	assert.ErrorContains(t, err, "bad address", "EFAULT, at the second page")
	h.shape[0] = int64(page)
	b, err = dlpack.Import(addr(&h.m))
	require.NoError(t, err, "the page still in the file")
	require.NoError(t, b.Close())
}

// Everything Import reads or calls through the tensor's pointers, placed
// in PROT_NONE or non-executable memory: an error, never a crash, and the
// deleter is not called.
func TestImportRefusesPointersIntoUnusableMemory(t *testing.T) {
	needSupported(t)
	none, page := mmapPages(t, 1)
	mprotect(t, none, page, syscall.PROT_NONE)
	data, _ := mmapPages(t, 1) // read-write, not executable
	for _, c := range []struct {
		name string
		set  func(h *hostile)
		want string
	}{
		{"shape in a PROT_NONE page", func(h *hostile) { h.m.Tensor.Shape = none }, "shape at"},
		{"strides in a PROT_NONE page", func(h *hostile) { h.m.Tensor.Strides = none }, "strides at"},
		{"deleter in a PROT_NONE page", func(h *hostile) { h.m.Deleter = none }, "without execute permission"},
		{"deleter in data memory", func(h *hostile) { h.m.Deleter = data }, "without execute permission"},
		{"deleter in the tensor itself", func(h *hostile) { h.m.Deleter = addr(&h.m) }, "without execute permission"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := hostTensor(t, addr(&newHostile().bytes[0]), 16)
			c.set(h)
			_, err := dlpack.Import(addr(&h.m))
			assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.ErrorContains(t, err, c.want)
			if h.m.Deleter != 0 {
				err := dlpack.Delete(addr(&h.m))
				assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "Delete does not call it either")
				assert.ErrorContains(t, err, "without execute permission")
			}
		})
	}
	for _, p := range []uintptr{none, none + 8} {
		_, err := dlpack.Import(p)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a tensor struct in a PROT_NONE page")
		_, err = dlpack.ImportUnversioned(p)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.ErrorIs(t, dlpack.Delete(p), cuda.ErrInvalidArgument)
	}
}
