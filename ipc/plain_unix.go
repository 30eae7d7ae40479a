//go:build unix

package ipc

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/cudamem/cudamem/cuda"
)

// Plain messages have no cudamem framing: one sendmsg whose data and
// SCM_RIGHTS descriptors travel together, one recvmsg on the other side,
// as Python's socket.send_fds and socket.recv_fds do. On a stream socket a
// long message may take several reads or writes, so use one connection
// from one sender and one receiver at a time.

// SendPlain sends data and the file descriptors fds in one sendmsg over a
// Unix socket, as Python's socket.send_fds does. The receiver gets
// duplicates; the caller still owns its fds. With descriptors, data must
// not be empty (a stream socket carries descriptors with bytes). On a
// stream socket a long data may go out in several writes; the
// descriptors travel with the first.
func SendPlain(conn *net.UnixConn, data []byte, fds ...int) error {
	const op = "ipc.SendPlain"
	if err := checkSend(op, conn, fds); err != nil {
		return err
	}
	if len(fds) > 0 && len(data) == 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%d file descriptors with no data (descriptors travel with at least one byte)", len(fds))
	}
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	n, _, err := conn.WriteMsgUnix(data, oob, nil)
	for err == nil && n < len(data) {
		var m int
		m, err = conn.Write(data[n:])
		n += m
	}
	if err != nil {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes and %d file descriptors (%d bytes sent): %w", len(data), len(fds), n, err)}
	}
	return nil
}

// ReceivePlain reads one message as Python's socket.recv_fds(sock,
// maxData, maxFDs) does: one recvmsg of at most maxData bytes with at
// most maxFDs descriptors, which the caller now owns (close-on-exec set).
// On a datagram or seqpacket socket that is one whole message; on a
// stream socket it is what has arrived, at least one byte (the
// descriptors come with the first bytes of what the peer sent, and the
// rest of a long message is read with conn.Read). End of stream with
// nothing received is an error matching io.EOF.
//
// The peer is not trusted: more than maxFDs descriptors (the kernel
// closes those it has no room for and reports truncated control data),
// data longer than maxData on a datagram socket, or malformed control
// data are refused with an error matching ErrInvalidArgument, and every
// descriptor that arrived with the message is closed first. maxData must
// be 1 to 1 GiB and maxFDs 0 to MaxFDs. A receiving socket whose kernel
// attaches control messages of its own is refused as ReceiveFDs refuses
// it. It gives up when ctx is done, as ReceiveFDs does.
func ReceivePlain(ctx context.Context, conn *net.UnixConn, maxData, maxFDs int) (data []byte, fds []int, err error) {
	const op = "ipc.ReceivePlain"
	switch {
	case maxData < 1 || maxData > maxFramePayload:
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "maxData %d, want 1 to %d", maxData, maxFramePayload)
	case maxFDs < 0 || maxFDs > MaxFDs:
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "maxFDs %d, want 0 to %d", maxFDs, MaxFDs)
	}
	err = withReadContext(ctx, op, conn, func() error {
		data, fds, err = receivePlain(op, conn, maxData, maxFDs)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return data, fds, nil
}

// receivePlain is ReceivePlain without the context.
func receivePlain(op string, conn *net.UnixConn, maxData, maxFDs int) ([]byte, []int, error) {
	buf := make([]byte, maxData)
	// Room for maxFDs descriptors exactly: the kernel closes any more.
	var oob []byte
	if maxFDs > 0 {
		oob = make([]byte, syscall.CmsgSpace(maxFDs*4))
	}
	n, oobn, flags, err := recvmsg(conn, buf, oob)
	fds, rerr := rights(oob[:oobn], nil)
	switch {
	case err != nil:
	case rerr != nil:
		err = rerr
	case flags&syscall.MSG_CTRUNC != 0:
		err = fmt.Errorf("%w: control data truncated (more than %d file descriptors, or a control message of the kernel's own that did not fit; the kernel closed the descriptors it had no room for)", cuda.ErrInvalidArgument, maxFDs)
	case len(fds) > maxFDs:
		err = fmt.Errorf("%w: %d file descriptors, at most %d expected", cuda.ErrInvalidArgument, len(fds), maxFDs)
	case flags&syscall.MSG_TRUNC != 0:
		err = fmt.Errorf("%w: a message longer than %d bytes", cuda.ErrInvalidArgument, maxData)
	case n == 0 && len(fds) == 0:
		err = fmt.Errorf("connection closed by the peer: %w", io.EOF)
	case n == 0:
		err = fmt.Errorf("%w: %d file descriptors with no data", cuda.ErrInvalidArgument, len(fds))
	}
	if err == nil {
		err = setCloexec(fds)
	}
	if err != nil {
		return nil, nil, &cuda.OpError{Op: op, Err: closeReceived(err, fds)}
	}
	return buf[:n], fds, nil
}
