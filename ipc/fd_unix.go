//go:build unix

package ipc

import (
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/cudamem/cudamem/cuda"
)

// MaxFDs is the most file descriptors one message carries.
const MaxFDs = 64

// SendFDs sends payload and the file descriptors over a Unix socket
// (SCM_RIGHTS). The receiver gets duplicates; the caller still owns (and
// should close) its own fds.
func SendFDs(conn *net.UnixConn, payload []byte, fds ...int) error {
	if conn == nil {
		return cuda.Errorf("ipc.SendFDs", cuda.ErrInvalidArgument, "nil connection")
	}
	if len(fds) > MaxFDs {
		return cuda.Errorf("ipc.SendFDs", cuda.ErrInvalidArgument, "%d file descriptors, at most %d per message", len(fds), MaxFDs)
	}
	if len(payload) == 0 {
		payload = []byte{0} // a message must carry at least one byte
	}
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	n, oobn, err := conn.WriteMsgUnix(payload, oob, nil)
	if err != nil {
		return fmt.Errorf("ipc.SendFDs: %w", err)
	}
	if n != len(payload) || oobn != len(oob) {
		return fmt.Errorf("ipc.SendFDs: short write (%d of %d bytes, %d of %d control bytes)", n, len(payload), oobn, len(oob))
	}
	return nil
}

// ReceiveFDs receives one message sent with SendFDs: its payload (up to
// maxPayload bytes) and the file descriptors it carried, which the caller
// now owns. A message carrying more than MaxFDs descriptors is rejected
// and every descriptor received is closed.
func ReceiveFDs(conn *net.UnixConn, maxPayload int) (payload []byte, fds []int, err error) {
	if conn == nil {
		return nil, nil, cuda.Errorf("ipc.ReceiveFDs", cuda.ErrInvalidArgument, "nil connection")
	}
	buf := make([]byte, max(maxPayload, 1))
	oob := make([]byte, syscall.CmsgSpace(MaxFDs*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, fmt.Errorf("ipc.ReceiveFDs: %w", err)
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, nil, fmt.Errorf("ipc.ReceiveFDs: control message: %w", err)
	}
	for _, m := range msgs {
		got, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, got...)
	}
	if flags&(syscall.MSG_CTRUNC|syscall.MSG_TRUNC) != 0 {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("ipc.ReceiveFDs: message truncated (payload over %d bytes or over %d fds)", maxPayload, MaxFDs)
	}
	for _, fd := range fds {
		syscall.CloseOnExec(fd)
	}
	return buf[:n], fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// dup duplicates fd with close-on-exec set.
func dup(fd int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	nfd, err := syscall.Dup(fd)
	if err != nil {
		return -1, err
	}
	syscall.CloseOnExec(nfd)
	return nfd, nil
}

// fileOf wraps a duplicate of fd as an *os.File (for exec.Cmd.ExtraFiles).
func fileOf(fd int, name string) (*os.File, error) {
	nfd, err := dup(fd)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), name), nil
}

// SendHandle sends an exported pool's fd and UUID over a Unix socket. h
// stays open on this side.
func SendHandle(conn *net.UnixConn, h *Handle) error {
	fd, err := h.FD()
	if err != nil {
		return err
	}
	u := h.UUID()
	return SendFDs(conn, u[:], fd)
}

// ReceiveHandle receives a Handle sent with SendHandle; the caller owns it.
func ReceiveHandle(conn *net.UnixConn) (*Handle, error) {
	payload, fds, err := ReceiveFDs(conn, len(UUID{}))
	if err != nil {
		return nil, err
	}
	if len(fds) != 1 || len(payload) != len(UUID{}) {
		closeFDs(fds)
		return nil, cuda.Errorf("ipc.ReceiveHandle", cuda.ErrInvalidArgument, "got %d fds and %d bytes, want 1 fd and a %d-byte UUID", len(fds), len(payload), len(UUID{}))
	}
	return NewHandle(fds[0], UUID(payload))
}
