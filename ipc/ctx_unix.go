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

// withReadContext runs receive with conn's read deadline tied to ctx: the
// context's deadline, or a deadline in the past as soon as it is
// cancelled, which wakes the blocked read. A ctx that can never end
// leaves conn's deadline alone.
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
	deadline, hasDeadline := ctx.Deadline() // zero when there is none: no deadline
	if ctx.Done() == nil && !hasDeadline {
		return receive()
	}
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
	// A failure to clear the deadline is not reported: after a successful
	// receive the caller owns what arrived, and an error would lose it.
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
