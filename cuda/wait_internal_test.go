package cuda

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPollStopsWhenDone(t *testing.T) {
	calls := 0
	err := poll(context.Background(), "op", func() (bool, error) {
		calls++
		return calls == 500, nil // past the spin phase, into the sleeps
	})
	require.NoError(t, err)
	assert.Equal(t, 500, calls, "no query after the one that reported done")
}

func TestPollReturnsQueryError(t *testing.T) {
	boom := errors.New("boom")
	err := poll(context.Background(), "op", func() (bool, error) { return false, boom })
	assert.ErrorIs(t, err, boom)
}

func TestPollCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := poll(ctx, "Stream.SyncContext", func() (bool, error) {
		calls++
		if calls == 3 {
			cancel()
		}
		return false, nil
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "Stream.SyncContext")
	assert.Equal(t, 3, calls, "the wait ends at the first look after the cancel")

	// A context cancelled before the call still lets work that is done
	// report done: the query comes first.
	err = poll(ctx, "op", func() (bool, error) { return true, nil })
	assert.NoError(t, err)
}

func TestPollDeadlineDuringSleep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	before := runtime.NumGoroutine()
	err := poll(ctx, "Event.SyncContext", func() (bool, error) { return false, nil })
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "Event.SyncContext", oe.Op)
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "polling starts no goroutine")
}

func TestPollNilContext(t *testing.T) {
	//lint:ignore SA1012 a nil context is the input under test
	err := poll(nil, "Stream.SyncContext", func() (bool, error) { return true, nil }) //nolint:staticcheck
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

func TestSyncContextOnNilAndClosed(t *testing.T) {
	ctx := context.Background()
	var s *Stream
	assert.ErrorIs(t, s.SyncContext(ctx), ErrInvalidArgument)
	assert.ErrorIs(t, (&Stream{dev: &Device{}, owned: true, closed: true}).SyncContext(ctx), ErrClosed)
	var e *Event
	assert.ErrorIs(t, e.SyncContext(ctx), ErrInvalidArgument)
	var d *Device
	assert.ErrorIs(t, d.SyncContext(ctx), ErrInvalidArgument)
	assert.ErrorIs(t, (&Device{}).SyncContext(ctx), ErrInvalidArgument)
}
