//go:build unix

package ipc

import (
	"context"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// dup returns a close-on-exec duplicate of fd that the caller owns.
func dup(fd int) (int, error) {
	f, err := osfd.DupInt(fd)
	if err != nil {
		return -1, err
	}
	return f.Release()
}

// poolLikeFD returns a descriptor of a kind a pool export may be (a
// character device: /dev/null), which the caller owns: ReceiveHandle and
// ImportPool refuse pipes, sockets and files.
func poolLikeFD(t *testing.T) int {
	t.Helper()
	f, err := os.Open(os.DevNull)
	require.NoError(t, err)
	fd, err := dup(int(f.Fd()))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return fd
}

func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	return socketPairOf(t, syscall.SOCK_STREAM)
}

func socketPairOf(t *testing.T, typ int) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, typ, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		require.NoError(t, err)
		f.Close()
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestSendReceiveFDs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fd counting uses /proc")
	}
	a, b := socketPair(t)
	before := testutil.FDs(t)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	require.NoError(t, SendFDs(a, []byte("hello"), int(w.Fd())))
	payload, fds, err := ReceiveFDs(context.Background(), b, 16)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(payload))
	require.Len(t, fds, 1)
	// Writing through the received duplicate reaches the pipe.
	got := os.NewFile(uintptr(fds[0]), "received")
	_, err = got.Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = r.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "x", string(buf))
	require.NoError(t, got.Close())
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
	testutil.AssertNoNewFDs(t, before, "no fd leaked")
}

func TestSendTooManyFDs(t *testing.T) {
	a, _ := socketPair(t)
	fds := make([]int, MaxFDs+1)
	err := SendFDs(a, nil, fds...)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "at most")
	assert.Error(t, SendFDs(nil, nil))
	_, _, err = ReceiveFDs(context.Background(), nil, 1)
	assert.Error(t, err)
}

func TestHandleLifecycle(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fd counting uses /proc")
	}
	before := testutil.FDs(t)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	w.Close()
	fd, err := dup(int(r.Fd()))
	require.NoError(t, err)
	r.Close()
	h, err := NewHandle(fd, cuda.NewUUID().String())
	require.NoError(t, err)
	got, err := h.FD()
	require.NoError(t, err)
	assert.Equal(t, fd, got)
	require.NoError(t, h.Close())
	require.NoError(t, h.Close(), "Close is idempotent")
	_, err = h.FD()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = h.ExtraFile()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	// Calls that use the fd name themselves when the Handle is closed.
	err = SendHandle(nil, h)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "ipc.SendHandle")
	_, err = ImportPool(&cuda.Device{}, h)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "ipc.ImportPool")
	testutil.AssertNoNewFDs(t, before)
	_, err = NewHandle(-1, UUID{}.String())
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestSendReceiveHandle(t *testing.T) {
	a, b := socketPair(t)
	fd := poolLikeFD(t)
	h, err := NewHandle(fd, cuda.NewUUID().String())
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, SendHandle(a, h))
	got, err := ReceiveHandle(context.Background(), b)
	require.NoError(t, err)
	defer got.Close()
	assert.Equal(t, h.UUID(), got.UUID())
	gfd, err := got.FD()
	require.NoError(t, err)
	assert.NotEqual(t, fd, gfd, "the receiver holds its own duplicate")
}

const envChildPipe = "CUDAMEM_TEST_IPC_CHILD_PIPE"

// TestExtraFileToChild hands a duplicated fd to a child process through
// exec.Cmd.ExtraFiles; the child writes through it.
func TestExtraFileToChild(t *testing.T) {
	if os.Getenv(envChildPipe) != "" {
		f := os.NewFile(3, "inherited")
		_, err := f.Write([]byte("from child"))
		require.NoError(t, err)
		return
	}
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	fd, err := dup(int(w.Fd()))
	require.NoError(t, err)
	w.Close()
	h, err := NewHandle(fd, cuda.NewUUID().String())
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestExtraFileToChild$")
	cmd.Env = append(os.Environ(), envChildPipe+"=1")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	f.Close()
	require.NoError(t, h.Close())
	buf := make([]byte, 32)
	n, _ := r.Read(buf)
	assert.Equal(t, "from child", string(buf[:n]))
}
