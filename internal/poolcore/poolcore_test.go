package poolcore

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// destroyer counts destructions and fails the first fail of them.
type destroyer struct {
	calls atomic.Int32
	fail  atomic.Int32
}

func (d *destroyer) fn() error {
	d.calls.Add(1)
	if d.fail.Load() > 0 {
		d.fail.Add(-1)
		return errors.New("destroy failed")
	}
	return nil
}

func TestZeroCoreOwnsNothing(t *testing.T) {
	var c Core
	if c.Owned() || c.IsClosed() || c.HasLive() {
		t.Fatal("zero Core: owned, closed or live")
	}
	if !c.Enter() {
		t.Fatal("Enter on a fresh Core failed")
	}
	c.Leave()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if c.Enter() {
		t.Fatal("Enter after Close succeeded")
	}
	if c.IsDestroyed() {
		t.Fatal("a Core without destroy function reports destroyed")
	}
	if err := c.Freed(); err != nil || c.Live() != 0 {
		t.Fatalf("Freed with nothing live: %v, live %d", err, c.Live())
	}
}

func TestDestroyOnCloseWhenIdle(t *testing.T) {
	var c Core
	var d destroyer
	c.SetDestroy(d.fn)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if d.calls.Load() != 1 || !c.IsDestroyed() {
		t.Fatalf("destroy calls %d, destroyed %v", d.calls.Load(), c.IsDestroyed())
	}
	if err := c.Close(); err != nil || d.calls.Load() != 1 {
		t.Fatalf("second Close: %v, destroy calls %d", err, d.calls.Load())
	}
}

func TestDestroyAfterLastFree(t *testing.T) {
	var c Core
	var d destroyer
	c.SetDestroy(d.fn)
	for range 2 {
		if !c.Enter() {
			t.Fatal("Enter failed")
		}
		c.Allocated()
		c.Leave()
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if d.calls.Load() != 0 {
		t.Fatal("destroyed with allocations live")
	}
	if err := c.Freed(); err != nil || d.calls.Load() != 0 {
		t.Fatalf("first free: %v, destroy calls %d", err, d.calls.Load())
	}
	if err := c.Freed(); err != nil || d.calls.Load() != 1 || !c.IsDestroyed() {
		t.Fatalf("last free: %v, destroy calls %d", err, d.calls.Load())
	}
	// A free beyond the count changes nothing.
	if err := c.Freed(); err != nil || c.Live() != 0 || d.calls.Load() != 1 {
		t.Fatalf("extra free: %v, live %d, destroy calls %d", err, c.Live(), d.calls.Load())
	}
}

func TestDeferredDestroyErrorRetriedByClose(t *testing.T) {
	var c Core
	var d destroyer
	d.fail.Store(1)
	c.SetDestroy(d.fn)
	c.Enter()
	c.Allocated()
	c.Leave()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Freed(); err == nil {
		t.Fatal("failed deferred destroy not reported by Freed")
	}
	if c.DeferredErr() == nil || c.IsDestroyed() {
		t.Fatal("deferred error not kept")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("retrying Close: %v", err)
	}
	if !c.IsDestroyed() || c.DeferredErr() != nil || d.calls.Load() != 2 {
		t.Fatalf("after retry: destroyed %v, deferred %v, calls %d", c.IsDestroyed(), c.DeferredErr(), d.calls.Load())
	}
}

func TestCloseFailureRetried(t *testing.T) {
	var c Core
	var d destroyer
	d.fail.Store(1)
	c.SetDestroy(d.fn)
	if err := c.Close(); err == nil {
		t.Fatal("failed destroy not reported")
	}
	if !c.IsClosed() || c.IsDestroyed() {
		t.Fatal("state after failed Close")
	}
	if err := c.Close(); err != nil || !c.IsDestroyed() {
		t.Fatalf("retry: %v", err)
	}
}

// TestCloseWaitsForCalls checks that Close does not destroy while a call
// holds the pool, and that a nested Enter inside it neither deadlocks
// nor succeeds once Close has begun.
func TestCloseWaitsForCalls(t *testing.T) {
	var c Core
	var inCall atomic.Bool
	var destroyedDuringCall atomic.Bool
	c.SetDestroy(func() error {
		if inCall.Load() {
			destroyedDuringCall.Store(true)
		}
		return nil
	})
	if !c.Enter() {
		t.Fatal("Enter failed")
	}
	inCall.Store(true)
	done := make(chan error)
	go func() { done <- c.Close() }()
	for !c.IsClosed() {
		time.Sleep(time.Millisecond)
	}
	if c.Enter() {
		t.Fatal("nested Enter after Close began succeeded")
	}
	select {
	case err := <-done:
		t.Fatalf("Close returned (%v) while a call was in progress", err)
	case <-time.After(20 * time.Millisecond):
	}
	inCall.Store(false)
	c.Leave()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if destroyedDuringCall.Load() || !c.IsDestroyed() {
		t.Fatalf("destroyed during call %v, destroyed %v", destroyedDuringCall.Load(), c.IsDestroyed())
	}
}

// TestConcurrentCallsAndClose races many callers that allocate and free
// against Close: the pool is destroyed exactly once, never during a call
// or with an allocation live.
func TestConcurrentCallsAndClose(t *testing.T) {
	for range 50 {
		var c Core
		var calls, allocs atomic.Int64
		var bad atomic.Bool
		var destroys atomic.Int32
		c.SetDestroy(func() error {
			destroys.Add(1)
			if calls.Load() != 0 || allocs.Load() != 0 {
				bad.Store(true)
			}
			return nil
		})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 100 {
					if !c.Enter() {
						return
					}
					calls.Add(1)
					allocs.Add(1)
					c.Allocated()
					calls.Add(-1)
					c.Leave()
					allocs.Add(-1)
					if err := c.Freed(); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if bad.Load() {
			t.Fatal("destroyed during a call or with allocations live")
		}
		if destroys.Load() != 1 {
			t.Fatalf("destroyed %d times", destroys.Load())
		}
	}
}
