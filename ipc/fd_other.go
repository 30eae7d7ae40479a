//go:build !unix

package ipc

import (
	"context"
	"net"

	"github.com/cudamem/cudamem/cuda"
)

// MaxFDs is the most file descriptors one message carries.
const MaxFDs = 64

func errNoFDs(op string) error {
	return cuda.Errorf(op, cuda.ErrNotSupported, "POSIX file descriptor IPC needs a Unix system")
}

// SendFDs is not supported without POSIX file descriptors.
func SendFDs(conn *net.UnixConn, payload []byte, fds ...int) error {
	return errNoFDs("ipc.SendFDs")
}

// ReceiveFDs is not supported without POSIX file descriptors.
func ReceiveFDs(conn *net.UnixConn, maxPayload int) ([]byte, []int, error) {
	return nil, nil, errNoFDs("ipc.ReceiveFDs")
}

// SendHandle is not supported without POSIX file descriptors.
func SendHandle(conn *net.UnixConn, h *Handle) error { return errNoFDs("ipc.SendHandle") }

// ReceiveHandle is not supported without POSIX file descriptors.
func ReceiveHandle(conn *net.UnixConn) (*Handle, error) { return nil, errNoFDs("ipc.ReceiveHandle") }

// ReceiveFDsContext is not supported without POSIX file descriptors.
func ReceiveFDsContext(ctx context.Context, conn *net.UnixConn, maxPayload int) ([]byte, []int, error) {
	return nil, nil, errNoFDs("ipc.ReceiveFDsContext")
}

// ReceiveHandleContext is not supported without POSIX file descriptors.
func ReceiveHandleContext(ctx context.Context, conn *net.UnixConn) (*Handle, error) {
	return nil, errNoFDs("ipc.ReceiveHandleContext")
}

// SendMsg is not supported without POSIX file descriptors.
func SendMsg(conn *net.UnixConn, data []byte, fds ...int) error { return errNoFDs("ipc.SendMsg") }

// ReceiveMsg is not supported without POSIX file descriptors.
func ReceiveMsg(conn *net.UnixConn, maxData, maxFDs int) ([]byte, []int, error) {
	return nil, nil, errNoFDs("ipc.ReceiveMsg")
}
