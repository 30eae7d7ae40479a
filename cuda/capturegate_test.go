package cuda

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A capture waiting for the calls admitted before it is not held off by
// later ones: they are refused without being counted, however many, so
// the count it waits for only falls.
func TestGateRefusesWithoutCounting(t *testing.T) {
	var g captureGate
	require.True(t, g.enter(callContext), "no capture: admitted")
	begun := make(chan struct{})
	go func() {
		defer close(begun)
		g.raise(true, false)
	}()
	for g.captures.Load() == 0 {
		runtime.Gosched()
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if g.enter(callContext) {
					t.Error("a call admitted while a capture waits to begin")
					g.leave(callContext)
				}
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 1, g.calls[callContext].Load(), "only the call admitted before the capture is counted")
	select {
	case <-begun:
		t.Fatal("the capture began before the admitted call left")
	default:
	}
	g.leave(callContext)
	<-begun
	assert.True(t, g.enter(callLegacy), "a non-blocking capture leaves the legacy stream free")
	g.leave(callLegacy)
	g.lower(true, false)
	assert.True(t, g.enter(callContext), "free again once the capture is over")
	g.leave(callContext)
}

// Deferred work waits for the last capture to end, has run when
// runDeferred returns, never runs while a capture is counted, and a
// panicking piece of it neither loses the rest nor leaves it counted.
func TestGateDeferredWork(t *testing.T) {
	var g captureGate
	assert.False(t, g.deferWork(func() { t.Error("queued with no capture") }), "no capture: the caller goes ahead")

	var ran atomic.Int32
	g.raise(true, false)
	g.raise(true, true) // a second capture, of a blocking stream
	require.True(t, g.deferWork(func() { ran.Add(1) }))
	g.runDeferred()
	assert.Zero(t, ran.Load(), "not while a capture is in flight")
	g.lower(true, true)
	g.runDeferred()
	assert.Zero(t, ran.Load(), "not while the other capture is in flight")
	g.lower(true, false)
	g.runDeferred()
	assert.EqualValues(t, 1, ran.Load(), "run when runDeferred returns")
	g.runDeferred()
	assert.EqualValues(t, 1, ran.Load(), "once")
	assert.Zero(t, g.pending.Load())

	rest := make(chan struct{})
	g.raise(true, false)
	require.True(t, g.deferWork(func() { panic("deferred work panics") }))
	require.True(t, g.deferWork(func() { close(rest) }))
	// No lowering here: it would start the work on its own goroutine,
	// and the panic would end the test binary. Lower the count directly.
	g.mu.Lock()
	g.captures.Add(-1)
	g.mu.Unlock()
	assert.PanicsWithValue(t, "deferred work panics", g.runDeferred)
	<-rest // run on a goroutine of its own
	for g.pending.Load() != 0 {
		runtime.Gosched()
	}
	assert.EqualValues(t, 0, g.calls[callContext].Load(), "the panic left no call counted")
	assert.True(t, g.runMu.TryLock(), "nor the run lock held")
	g.runMu.Unlock()
}
