package cuda

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gate is a fake blocking wait: it returns when released, counting calls.
type gate struct {
	calls   atomic.Int32
	release chan struct{}
	err     error
}

func newGate() *gate { return &gate{release: make(chan struct{})} }

func (g *gate) wait() error {
	g.calls.Add(1)
	<-g.release
	return g.err
}

func notDone() (bool, error) { return false, nil }

func settle(before int) int {
	for i := 0; i < 1000 && runtime.NumGoroutine() > before; i++ {
		time.Sleep(time.Millisecond)
	}
	return runtime.NumGoroutine()
}

func TestAwaitDoneAnswersWithoutWaiting(t *testing.T) {
	var w waiter
	g := newGate()
	err := await(context.Background(), "op", &w, func() (bool, error) { return true, nil }, g.wait)
	require.NoError(t, err)
	assert.Zero(t, g.calls.Load(), "finished work needs no blocking wait")
}

func TestAwaitSharesOneWait(t *testing.T) {
	var w waiter
	g := newGate()
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = await(context.Background(), "op", &w, notDone, g.wait)
		}()
	}
	// Every caller is in the first round or the one after it.
	for g.calls.Load() == 0 {
		runtime.Gosched()
	}
	time.Sleep(10 * time.Millisecond)
	close(g.release)
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	assert.LessOrEqual(t, g.calls.Load(), int32(2), "50 waiters, at most two blocking waits")
	assert.LessOrEqual(t, settle(before), before, "the waiter goroutine ends with the work")
}

func TestAwaitCancelled(t *testing.T) {
	var w waiter
	g := newGate()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(2*time.Millisecond, cancel)
	err := await(ctx, "Stream.SyncContext", &w, notDone, g.wait)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "Stream.SyncContext", oe.Op)

	// The wait goes on until the work ends; a new caller joins a later
	// round and sees its result.
	g.err = errors.New("boom")
	done := make(chan error)
	go func() { done <- await(context.Background(), "op", &w, notDone, g.wait) }()
	close(g.release)
	assert.ErrorIs(t, <-done, g.err)
}

func TestAwaitContextDoneBeforeWaiting(t *testing.T) {
	var w waiter
	g := newGate()
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	err := await(ctx, "op", &w, notDone, g.wait)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, g.calls.Load(), "an ended context starts no wait")
	// Work that is done still reports done.
	assert.NoError(t, await(ctx, "op", &w, func() (bool, error) { return true, nil }, g.wait))
}

func TestAwaitQueryError(t *testing.T) {
	var w waiter
	boom := errors.New("boom")
	err := await(context.Background(), "op", &w, func() (bool, error) { return false, boom }, newGate().wait)
	assert.ErrorIs(t, err, boom)
}

func TestAwaitNilContext(t *testing.T) {
	var w waiter
	//lint:ignore SA1012 a nil context is the input under test
	err := await(nil, "op", &w, notDone, newGate().wait) //nolint:staticcheck
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

func TestSyncContextOnNilAndClosed(t *testing.T) {
	ctx := context.Background()
	var s *Stream
	assert.ErrorIs(t, s.SyncContext(ctx), ErrInvalidArgument)
	closed := &Stream{dev: &Device{}, owned: true}
	closed.guard.Close()
	assert.ErrorIs(t, closed.SyncContext(ctx), ErrClosed)
	var e *Event
	assert.ErrorIs(t, e.SyncContext(ctx), ErrInvalidArgument)
	var d *Device
	assert.ErrorIs(t, d.SyncContext(ctx), ErrInvalidArgument)
	assert.ErrorIs(t, (&Device{}).SyncContext(ctx), ErrInvalidArgument)
}
