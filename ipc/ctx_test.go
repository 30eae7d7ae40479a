//go:build linux

package ipc

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

func TestReceiveHandleCancelled(t *testing.T) {
	for name, typ := range socketTypes {
		t.Run(name, func(t *testing.T) {
			a, b := socketPairOf(t, typ)
			before := testutil.FDs(t)
			goroutines := runtime.NumGoroutine()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(5*time.Millisecond, cancel)
			h, err := ReceiveHandle(ctx, b)
			require.Error(t, err)
			assert.Nil(t, h)
			assert.ErrorIs(t, err, context.Canceled)
			assert.Contains(t, err.Error(), "ipc.ReceiveHandle")
			assert.Equal(t, before, testutil.FDs(t), "no descriptor left open")
			for i := 0; i < 1000 && runtime.NumGoroutine() > goroutines; i++ {
				time.Sleep(time.Millisecond) // the timer's goroutine ending
			}
			assert.LessOrEqual(t, runtime.NumGoroutine(), goroutines, "no goroutine left waiting")

			// Nothing was read: the connection still works, and the
			// cancellation's deadline was cleared.
			sent, err := NewHandle(poolLikeFD(t), cuda.NewUUID().String())
			require.NoError(t, err)
			defer sent.Close()
			go func() {
				time.Sleep(10 * time.Millisecond) // let the receive block first
				assert.NoError(t, SendHandle(a, sent))
			}()
			got, err := ReceiveHandle(context.Background(), b)
			require.NoError(t, err)
			defer got.Close()
			assert.Equal(t, sent.UUID(), got.UUID())
		})
	}
}

func TestReceiveFDsDeadline(t *testing.T) {
	_, b := socketPairOf(t, socketTypes["seqpacket"])
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	_, fds, err := ReceiveFDs(ctx, b, 16)
	assert.Nil(t, fds)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)

	// A context already done makes no read at all.
	_, _, err = ReceiveFDs(ctx, b, 16)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestReceiveContextBadArguments(t *testing.T) {
	_, b := socketPair(t)
	//lint:ignore SA1012 a nil context is the input under test
	_, err := ReceiveHandle(nil, b) //nolint:staticcheck
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = ReceiveHandle(context.Background(), nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, _, err = ReceiveFDs(context.Background(), b, -1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// TestReceiveBackgroundKeepsDeadline: with context.Background() every
// receive leaves a read deadline set on the connection in force (the
// context cannot end, so it does not replace it), and one that can end
// clears it on return. Were Background to replace the deadline with none,
// these receives would block forever on a silent peer.
func TestReceiveBackgroundKeepsDeadline(t *testing.T) {
	_, b := socketPairOf(t, socketTypes["seqpacket"])
	for name, recv := range map[string]func() error{
		"ReceiveFDs":    func() error { _, _, err := ReceiveFDs(context.Background(), b, 16); return err },
		"ReceiveHandle": func() error { _, err := ReceiveHandle(context.Background(), b); return err },
		"ReceivePlain":  func() error { _, _, err := ReceivePlain(context.Background(), b, 16, 1); return err },
	} {
		require.NoError(t, b.SetReadDeadline(time.Now().Add(5*time.Millisecond)))
		err := recv()
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded, name)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "%s: the connection's deadline, not a context's", name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, b.SetReadDeadline(time.Now().Add(-time.Second)))
	done := make(chan error, 1)
	go func() { _, _, err := ReceiveFDs(ctx, b, 16); done <- err }()
	time.Sleep(10 * time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled, "a context that can end replaces the connection's deadline")
}
