//go:build linux

package ipc

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
)

// unixPair returns both ends of a socketpair of type typ as *net.UnixConn.
func unixPair(t *testing.T, typ int) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, typ|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		require.NoError(t, err)
		f.Close()
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// pipePair returns a pipe's ends, closed when the test ends.
func pipePair(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	require.NoError(t, syscall.Pipe2(p[:], syscall.O_CLOEXEC))
	t.Cleanup(func() { syscall.Close(p[0]); syscall.Close(p[1]) })
	return p[0], p[1]
}

// The plain message carries data and working descriptors, on every socket
// type; the descriptors received are close-on-exec duplicates.
func TestSendReceivePlain(t *testing.T) {
	for _, typ := range []int{syscall.SOCK_STREAM, syscall.SOCK_SEQPACKET, syscall.SOCK_DGRAM} {
		a, b := unixPair(t, typ)
		r, w := pipePair(t)
		base := fdCount(t)
		require.NoError(t, SendPlain(a, []byte("pool-uuid"), r, w))
		data, fds, err := ReceivePlain(context.Background(), b, 64, 4)
		require.NoError(t, err)
		assert.Equal(t, "pool-uuid", string(data))
		require.Len(t, fds, 2)
		for _, fd := range fds {
			flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			require.NoError(t, err)
			assert.NotZero(t, flags&unix.FD_CLOEXEC, "close-on-exec")
		}
		// The received write end feeds the original read end.
		_, err = syscall.Write(fds[1], []byte{42})
		require.NoError(t, err)
		got := make([]byte, 1)
		_, err = syscall.Read(r, got)
		require.NoError(t, err)
		assert.Equal(t, byte(42), got[0])
		for _, fd := range fds {
			require.NoError(t, syscall.Close(fd))
		}
		assert.Equal(t, base, fdCount(t), "socket type %d: back to the baseline", typ)
	}
}

// A hostile peer: more descriptors than asked for, data longer than the
// buffer on a datagram socket, end of stream. Each is an error, and every
// descriptor that arrived is closed.
func TestReceivePlainHostile(t *testing.T) {
	r, w := pipePair(t)

	a, b := unixPair(t, syscall.SOCK_STREAM)
	base := fdCount(t)
	require.NoError(t, syscall.Sendmsg(rawFD(t, a), []byte("x"), syscall.UnixRights(r, w, r, w), nil, 0))
	_, _, err := ReceivePlain(context.Background(), b, 16, 2)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "truncated")
	assert.Equal(t, base, fdCount(t), "extra descriptors closed")

	a, b = unixPair(t, syscall.SOCK_SEQPACKET)
	base = fdCount(t)
	require.NoError(t, SendPlain(a, []byte(strings.Repeat("y", 100)), r))
	_, _, err = ReceivePlain(context.Background(), b, 10, 1)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "longer than 10 bytes")
	assert.Equal(t, base, fdCount(t), "the descriptor of a refused message is closed")

	a, b = unixPair(t, syscall.SOCK_STREAM)
	require.NoError(t, a.Close())
	_, _, err = ReceivePlain(context.Background(), b, 10, 1)
	require.ErrorIs(t, err, io.EOF)

	for _, c := range []struct {
		maxData, maxFDs int
	}{{0, 1}, {-1, 1}, {1, -1}, {1, MaxFDs + 1}, {maxFramePayload + 1, 0}} {
		_, _, err := ReceivePlain(context.Background(), b, c.maxData, c.maxFDs)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "%+v", c)
	}
	_, _, err = ReceivePlain(context.Background(), nil, 1, 1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorIs(t, SendPlain(nil, []byte("x")), cuda.ErrInvalidArgument)
	assert.ErrorIs(t, SendPlain(a, nil, r), cuda.ErrInvalidArgument, "descriptors need data")
	assert.ErrorIs(t, SendPlain(a, []byte("x"), -1), cuda.ErrInvalidArgument)
}

// Python peers, with nothing but socket.send_fds and socket.recv_fds
// (Python 3.9+): a descriptor and a UUID each way, the data checked on
// both sides through the descriptor itself (a pipe).
func TestMsgWithPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	if out, err := exec.Command(py, "-c", "import socket,sys; sys.exit(0 if hasattr(socket, 'send_fds') else 3)").CombinedOutput(); err != nil {
		t.Skipf("python3 without socket.send_fds (3.9+): %v %s", err, out)
	}
	a, b := unixPair(t, syscall.SOCK_STREAM)
	f, err := b.File() // the child's end, as its fd 3
	require.NoError(t, err)
	defer f.Close()
	script := `
import os, socket
s = socket.socket(fileno=3)
# Go -> Python: a UUID and a pipe's write end.
data, fds, _, _ = socket.recv_fds(s, 64, 4)
assert data == b"go-pool-uuid", data
assert len(fds) == 1, fds
os.write(fds[0], b"from python")
os.close(fds[0])
# Python -> Go: a UUID and a pipe's read end holding a message.
r, w = os.pipe()
os.write(w, b"python wrote this")
os.close(w)
socket.send_fds(s, [b"py-pool-uuid"], [r])
os.close(r)
`
	cmd := exec.Command(py, "-c", script)
	cmd.ExtraFiles = []*os.File{f}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	r, w := pipePair(t)
	require.NoError(t, SendPlain(a, []byte("go-pool-uuid"), w))
	data, fds, err := ReceivePlain(context.Background(), a, 64, 4)
	waitErr := cmd.Wait()
	require.NoError(t, err, "python: %s", out.String())
	require.NoError(t, waitErr, "python: %s", out.String())
	assert.Equal(t, "py-pool-uuid", string(data))
	require.Len(t, fds, 1)
	defer syscall.Close(fds[0])
	got := make([]byte, 64)
	n, err := syscall.Read(fds[0], got)
	require.NoError(t, err)
	assert.Equal(t, "python wrote this", string(got[:n]), "Python's data, read through the descriptor it sent")
	n, err = syscall.Read(r, got)
	require.NoError(t, err)
	assert.Equal(t, "from python", string(got[:n]), "Python wrote through the descriptor Go sent")
	if errors.Is(err, io.EOF) {
		t.Fatal("unreachable")
	}
}
