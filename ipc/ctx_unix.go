//go:build unix

package ipc

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/cudamem/cudamem/cuda"
)

// ReceiveFDsContext is ReceiveFDs that gives up when ctx is done: it
// returns an error naming the operation that wraps ctx's error
// (context.Canceled or context.DeadlineExceeded), having closed any
// descriptor that arrived. It works through the connection's read
// deadline (no goroutine waits for the message), so it clears that
// deadline when it returns. After a cancellation on a stream socket the
// connection's position in the byte stream is unknown: close it.
func ReceiveFDsContext(ctx context.Context, conn *net.UnixConn, maxPayload int) (payload []byte, fds []int, err error) {
	const op = "ipc.ReceiveFDsContext"
	if err := withReadContext(ctx, op, conn, func() error {
		payload, fds, err = receiveFDs(op, conn, maxPayload, MaxFDs)
		return err
	}); err != nil {
		return nil, nil, err
	}
	return payload, fds, nil
}

// ReceiveHandleContext is ReceiveHandle that gives up when ctx is done
// (see ReceiveFDsContext).
func ReceiveHandleContext(ctx context.Context, conn *net.UnixConn) (h *Handle, err error) {
	const op = "ipc.ReceiveHandleContext"
	if err := withReadContext(ctx, op, conn, func() error {
		h, err = receiveHandle(op, conn)
		return err
	}); err != nil {
		return nil, err
	}
	return h, nil
}

// withReadContext runs receive with conn's read deadline tied to ctx: the
// context's deadline, or a deadline in the past as soon as it is
// cancelled, which wakes the blocked read. The receive functions close
// what arrived with a failed message themselves.
func withReadContext(ctx context.Context, op string, conn *net.UnixConn, receive func() error) error {
	if ctx == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil context (use context.Background())")
	}
	if conn == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil connection")
	}
	if err := ctx.Err(); err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	deadline, _ := ctx.Deadline() // zero when there is none: no deadline
	if err := conn.SetReadDeadline(deadline); err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	woke := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(woke)
		conn.SetReadDeadline(time.Unix(1, 0))
	})
	err := receive()
	if !stop() {
		// The cancellation ran or is running: let it finish with the
		// deadline before clearing it.
		<-woke
	}
	// A failure to clear the deadline (the connection closed meanwhile,
	// say) is not reported: after a successful receive the caller owns
	// what arrived, and an error would lose it.
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// Only this function set the deadline: it was ctx's.
		cause := ctx.Err()
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		return &cuda.OpError{Op: op, Err: errors.Join(cause, err)}
	}
	return err
}
