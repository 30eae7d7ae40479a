//go:build linux

package virtual_test

// Ports of cuda.core's tests/memory_ipc/test_vmm_ipc.py that need one
// process (the cross-process ones are in package ipc: TestIpcVMMGrownRoundTrip,
// TestVmmIpcGrownBufferImportsAsOneRange). Export's chunks are the Go
// side of cuda.core's IPC descriptor: their fds are the caller's.

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/virtual"
)

// mapped reports whether the driver has a mapping at p.
func mapped(t *testing.T, d *cuda.Device, p cuda.DevicePtr) bool {
	t.Helper()
	h, err := d.MemRetainAllocationHandle(p)
	if err != nil {
		return false
	}
	require.NoError(t, d.MemRelease(h))
	return true
}

// fdOpen reports whether fd is an open descriptor of this process.
func fdOpen(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil
}

// TestVmmIpcImportInSameProcessAliasesMemory (test_import_in_same_process_aliases_memory):
// chunks imported where they were exported map the same memory at another
// address: each side sees the other's writes, the import keeps the memory
// after the exporter's buffer is closed, and closing both unmaps both.
func TestVmmIpcImportInSameProcessAliasesMemory(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r := newResource(t, d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	b, err := r.Allocate(1, s)
	require.NoError(t, err)
	chunks, err := r.Export(b)
	require.NoError(t, err)
	alias, err := r.Import(chunks, b.Size())
	require.NoError(t, err)
	require.NoError(t, virtual.CloseChunkFDs(chunks), "the import holds the memory, not the fds")
	assert.NotEqual(t, b.Ptr(), alias.Ptr())
	require.True(t, mapped(t, d, alias.Ptr()))

	require.NoError(t, k.Write(s, b.Ptr(), b.Size(), 33))
	k.RequireCheck(t, s, alias.Ptr(), alias.Size(), 33)
	require.NoError(t, k.Write(s, alias.Ptr(), alias.Size(), 44))
	k.RequireCheck(t, s, b.Ptr(), b.Size(), 44)

	ptr, aliasPtr := b.Ptr(), alias.Ptr()
	require.NoError(t, b.Close())
	assert.False(t, mapped(t, d, ptr), "the exporter's range is unmapped")
	require.True(t, mapped(t, d, aliasPtr), "the import keeps the memory alive")
	k.RequireCheck(t, s, aliasPtr, alias.Size(), 44)
	require.NoError(t, alias.Close())
	assert.False(t, mapped(t, d, aliasPtr))
}

// TestVmmIpcDescriptorOwnsItsFileDescriptors (test_descriptor_owns_its_file_descriptors):
// Export's fds are open until the caller closes them with CloseChunkFDs,
// whatever happens to the buffer, and then closed; an Import neither
// takes nor closes them. Nothing else is left open.
func TestVmmIpcDescriptorOwnsItsFileDescriptors(t *testing.T) {
	d := cudatest.Device(t)
	r := newResource(t, d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	b, err := r.Allocate(1, nil)
	require.NoError(t, err)
	before := testutil.FDs(t)
	chunks, err := r.Export(b)
	require.NoError(t, err)
	require.Len(t, chunks, 1)
	fd := chunks[0].FD
	require.True(t, fdOpen(fd))
	imp, err := r.Import(chunks, b.Size())
	require.NoError(t, err)
	require.NoError(t, imp.Close())
	require.NoError(t, b.Close())
	assert.True(t, fdOpen(fd), "the chunks' fds are the caller's: closing the buffers leaves them open")
	require.NoError(t, virtual.CloseChunkFDs(chunks))
	assert.False(t, fdOpen(fd))
	testutil.AssertNoNewFDs(t, before, "nothing else left open")
}

// TestVmmIpcErrors (test_errors): a resource made without POSIX fd
// handles refuses to export, naming why, and a closed buffer is refused
// with cuda.ErrClosed; chunks that are not an export (no chunk, a bad fd,
// a size past the chunks) are refused before the driver.
func TestVmmIpcErrors(t *testing.T) {
	d := cudatest.Device(t)
	private := newResource(t, d, &virtual.Options{HandleType: virtual.HandleNone})
	b, err := private.Allocate(1, nil)
	require.NoError(t, err)
	_, err = private.Export(b)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "without POSIX fd handles")
	require.NoError(t, b.Close())

	shared := newResource(t, d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	b, err = shared.Allocate(1, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	_, err = shared.Export(b)
	require.ErrorIs(t, err, cuda.ErrClosed, "a closed buffer")

	g := shared.Granularity()
	for name, tc := range map[string]struct {
		chunks []virtual.Chunk
		size   uint64
	}{
		"no chunk":              {nil, g},
		"negative fd":           {[]virtual.Chunk{{FD: -1, Size: g}}, g},
		"size past the chunks":  {[]virtual.Chunk{{FD: 0, Size: g}}, 2 * g},
		"chunk off granularity": {[]virtual.Chunk{{FD: 0, Size: g / 2}}, 1},
	} {
		_, err := shared.Import(tc.chunks, tc.size)
		assert.True(t, errors.Is(err, cuda.ErrInvalidArgument), "%s: %v", name, err)
	}
}

// The tests above over the fake driver (in a child process), which
// exports and imports VMM memory within one process.
func TestVmmIpcPortsFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestVmmIpcImportInSameProcessAliasesMemory", "TestVmmIpcDescriptorOwnsItsFileDescriptors", "TestVmmIpcErrors")
}
