//go:build linux

package osfd

import (
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
)

// TestCheckExport: the check package ipc (pool handles) and package
// virtual (VMM chunks) share refuses the kinds a driver export never is,
// naming the operation, the fd, its kind and what was expected, and
// accepts character devices and anonymous inodes. It closes nothing.
func TestCheckExport(t *testing.T) {
	dir := t.TempDir()
	regular := dir + "/file"
	require.NoError(t, os.WriteFile(regular, []byte("x"), 0o600))
	mk := func(t *testing.T, fd int, err error) int {
		t.Helper()
		require.NoError(t, err)
		t.Cleanup(func() { syscall.Close(fd) })
		return fd
	}
	refused := map[string]struct {
		fd   func(t *testing.T) int
		kind string
	}{
		"pipe": {func(t *testing.T) int { return mk(t, pipeFD(t), nil) }, "pipe or FIFO"},
		"socket": {func(t *testing.T) int {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			require.NoError(t, syscall.Close(fds[1]))
			return mk(t, fds[0], nil)
		}, "socket"},
		"regular file": {func(t *testing.T) int {
			fd, err := syscall.Open(regular, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			return mk(t, fd, err)
		}, "regular file"},
		"directory": {func(t *testing.T) int {
			fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			return mk(t, fd, err)
		}, "directory"},
		"memfd": {func(t *testing.T) int {
			fd, err := unix.MemfdCreate("not-an-export", unix.MFD_CLOEXEC)
			return mk(t, fd, err)
		}, "regular file"},
	}
	for name, c := range refused {
		t.Run(name, func(t *testing.T) {
			fd := c.fd(t)
			err := CheckExport("test.Op", fd, "a thing")
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "test.Op")
			assert.Contains(t, err.Error(), "file descriptor "+strconv.Itoa(fd)+" is a "+c.kind)
			assert.Contains(t, err.Error(), "not a thing exported by the driver")
			assert.True(t, isOpen(fd), "the refused fd was closed")
		})
	}
	null, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	mk(t, null, err)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	mk(t, efd, err)
	for name, fd := range map[string]int{"character device": null, "anonymous inode": efd} {
		assert.NoError(t, CheckExport("test.Op", fd, "a thing"), name)
	}
	closed := pipeFD(t)
	require.NoError(t, syscall.Close(closed))
	assert.ErrorContains(t, CheckExport("test.Op", closed, "a thing"), "fstat")
	assert.ErrorIs(t, CheckExport("test.Op", -1, "a thing"), cuda.ErrInvalidArgument)
}
