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
func ReceiveFDs(ctx context.Context, conn *net.UnixConn, maxPayload int) ([]byte, []int, error) {
	return nil, nil, errNoFDs("ipc.ReceiveFDs")
}

// SendHandle is not supported without POSIX file descriptors.
func SendHandle(conn *net.UnixConn, h *Handle) error { return errNoFDs("ipc.SendHandle") }

// ReceiveHandle is not supported without POSIX file descriptors.
func ReceiveHandle(ctx context.Context, conn *net.UnixConn) (*Handle, error) {
	return nil, errNoFDs("ipc.ReceiveHandle")
}

// SendPlain is not supported without POSIX file descriptors.
func SendPlain(conn *net.UnixConn, data []byte, fds ...int) error { return errNoFDs("ipc.SendPlain") }

// ReceivePlain is not supported without POSIX file descriptors.
func ReceivePlain(ctx context.Context, conn *net.UnixConn, maxData, maxFDs int) ([]byte, []int, error) {
	return nil, nil, errNoFDs("ipc.ReceivePlain")
}
