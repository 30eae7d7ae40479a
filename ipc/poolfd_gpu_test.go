//go:build linux

package ipc_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/ipc"
)

// TestDriverPoolFDKind: the fd the driver exports a pool as is of a kind
// ImportPool and ReceiveHandle accept (they refuse pipes, FIFOs, sockets,
// regular files, directories, symbolic links and block devices before the
// driver sees them); it says what the kind is. The imports themselves
// (ImportPool in a child) are TestIpcMempool and TestIpcOverSocket.
func TestDriverPoolFDKind(t *testing.T) {
	d := cudatest.Device(t)
	p := ipcPool(t, d)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	defer h.Close()
	fd, err := h.FD()
	require.NoError(t, err)
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(fd, &st))
	var fs syscall.Statfs_t
	require.NoError(t, syscall.Fstatfs(fd, &fs))
	target, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	t.Logf("the driver's pool fd: %q, mode %#o (type %#o), file system %#x", target, st.Mode, st.Mode&syscall.S_IFMT, fs.Type)

	a, b, err := socketPairConns()
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	require.NoError(t, ipc.SendHandle(a, h))
	got, err := ipc.ReceiveHandle(context.Background(), b)
	require.NoError(t, err, "ReceiveHandle refused the driver's own pool fd (mode %#o): the kind check is wrong", st.Mode)
	defer got.Close()
	assert.Equal(t, h.UUID(), got.UUID())
}

// socketPairConns returns the two ends of a stream socketpair.
func socketPairConns() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			}
			return nil, nil, err
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1], nil
}
