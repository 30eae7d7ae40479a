//go:build unix

package virtual

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// TestImportRefusesNonExportFDs: Import handed a peer's fds to the driver
// whatever they were; ipc.ImportPool refuses kinds the driver's export
// never is, and Import now shares that check (osfd.CheckExport): a pipe,
// FIFO, socket, regular file or directory in any chunk is refused before
// any driver call, naming the chunk, the fd and its kind. The fds stay
// the caller's: none is closed.
func TestImportRefusesNonExportFDs(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	regular := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(regular, []byte("not memory"), 0o600))
	open := func(path string, flags int) func(t *testing.T) int {
		return func(t *testing.T) int {
			fd, err := syscall.Open(path, flags|syscall.O_CLOEXEC, 0)
			require.NoError(t, err)
			return fd
		}
	}
	for name, c := range map[string]struct {
		make func(t *testing.T) int
		kind string
	}{
		"pipe": {func(t *testing.T) int {
			var p [2]int
			require.NoError(t, syscall.Pipe(p[:]))
			require.NoError(t, syscall.Close(p[1]))
			return p[0]
		}, "pipe or FIFO"},
		"FIFO": {open(fifo, syscall.O_RDONLY|syscall.O_NONBLOCK), "pipe or FIFO"},
		"socket": {func(t *testing.T) int {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
			require.NoError(t, err)
			require.NoError(t, syscall.Close(fds[1]))
			return fds[0]
		}, "socket"},
		"regular file": {open(regular, syscall.O_RDONLY), "regular file"},
		"directory":    {open(dir, syscall.O_RDONLY), "directory"},
	} {
		t.Run(name, func(t *testing.T) {
			r, f := newFakeResource(t, testGran, &Options{HandleType: HandlePosixFD})
			calls := f.calls
			fd := c.make(t)
			defer syscall.Close(fd)
			good := devNullFDs(t, 1)[0]
			nb, err := r.Import([]Chunk{{FD: good, Size: testGran}, {FD: fd, Size: testGran}}, 2*testGran)
			require.Nil(t, nb)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			require.Contains(t, err.Error(), "virtual.Import")
			require.Contains(t, err.Error(), "file descriptor "+strconv.Itoa(fd)+" is a "+c.kind)
			require.Contains(t, err.Error(), "chunk 1")
			require.Equal(t, calls, f.calls, "the driver was called: %v", f.log[calls:])
			var st syscall.Stat_t
			require.NoError(t, syscall.Fstat(fd, &st), "the refused fd was closed; it is the caller's")
		})
	}

	// A closed fd is refused too, before the driver.
	r, f := newFakeResource(t, testGran, &Options{HandleType: HandlePosixFD})
	calls := f.calls
	fd := devNullFDs(t, 1)[0]
	_, err := r.Import([]Chunk{{FD: 1 << 20, Size: testGran}, {FD: fd, Size: testGran}}, testGran)
	require.Error(t, err)
	require.Contains(t, err.Error(), "virtual.Import")
	require.Equal(t, calls, f.calls)
}
