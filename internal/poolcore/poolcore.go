package poolcore

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/warn"
)

// ErrDeferred, returned (or wrapped) by a destroy function, means the
// destruction cannot run now and the function has arranged for Retry to
// be called once it can. It is not a failure: Close returns nil, and the
// pool counts as closed but not yet destroyed.
var ErrDeferred = errors.New("poolcore: destruction deferred")

// Core is the lifecycle of one driver pool: a cuda.Guard for the calls in
// progress (Enter and Leave bracket each one; IsClosed reports whether
// Close has begun), plus what a pool needs on top of it, the count of live
// allocations and a destruction that waits for the last of them. Its
// methods are safe for concurrent use.
type Core struct {
	cuda.Guard
	live atomic.Int64 // allocations made and not yet freed

	mu        sync.Mutex // serializes destruction
	closing   bool       // Close finished waiting for calls: Freed may destroy from now on
	destroyed bool
	destroy   func() error  // nil: nothing to destroy (a borrowed pool)
	deferred  error         // the error of a destruction Freed attempted
	name      func() string // names the pool in warnings (SetName)
}

// SetName names the pool in the warnings of destructions that fail where
// no caller sees the error (Freed's, Retry's): name returns, say,
// "DevicePool 0x55d0c1a2b3c0 on GPU 0". It runs only for a warning, so
// making a pool (an IPC child's import, say) does not pay for the text.
// Call it before c is shared.
func (c *Core) SetName(name func() string) { c.name = name }

// warnDeferred logs err, the failure of a destruction that Freed or Retry
// ran: its callers (a free that succeeded, the end of a capture) have no
// one to give it to, and the next Close, which reports it too, may never
// come.
func (c *Core) warnDeferred(err error) {
	if err == nil {
		return // no warning: the name is not built
	}
	name := ""
	if c.name != nil {
		name = c.name()
	}
	warn.Failed("deferred pool destruction", err, "pool", name)
}

// SetDestroy makes c own its pool: fn destroys it, once, when c is closed
// and nothing is live. Call it before c is shared.
func (c *Core) SetDestroy(fn func() error) { c.destroy = fn }

// Owned reports whether c destroys its pool on Close (SetDestroy was given
// a function).
func (c *Core) Owned() bool { return c.destroy != nil }

// Allocated counts one more live allocation. Call it between Enter and
// Leave, after the allocation succeeded, so that Close (which waits for
// the call) sees it.
func (c *Core) Allocated() { c.live.Add(1) }

// Live is the number of live allocations.
func (c *Core) Live() int64 { return c.live.Load() }

// HasLive reports whether any allocation is live. Deallocate checks it
// before freeing, so that a free of memory the pool never handed out is
// refused rather than driving the count below zero.
func (c *Core) HasLive() bool { return c.live.Load() > 0 }

// Freed counts one allocation fewer; call it after the free succeeded. If
// it was the last live allocation of a closed owned pool, it destroys the
// pool and returns the destruction's error, which is also kept for the
// next Close (the free itself succeeded, so callers usually report
// nothing). The count never goes below zero.
func (c *Core) Freed() error {
	for {
		n := c.live.Load()
		if n <= 0 {
			return nil
		}
		if c.live.CompareAndSwap(n, n-1) {
			// Close closes the Guard before it looks at the live count,
			// so if it is not closed yet, Close will see this free: only
			// the last free of a closing pool takes the lock.
			if n > 1 || !c.IsClosed() {
				return nil
			}
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closing {
		return nil
	}
	err := c.finishLocked()
	c.deferred = err
	c.warnDeferred(err)
	return err
}

// Close marks the pool closed (later Enters fail), waits for the calls in
// progress to end, then destroys an owned pool if nothing is live (else
// the last Freed does). It returns the destruction's error, or that of a
// deferred destruction that failed and fails again; calling Close again
// retries. Close must not be called from inside a call on the same pool
// (between Enter and Leave): it would wait for itself.
func (c *Core) Close() error {
	c.Guard.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	// A deferred destruction that failed is retried here; its old error
	// is superseded by the outcome of the retry.
	c.deferred = c.finishLocked()
	return c.deferred
}

// DeferredErr returns the error of the last failed destruction not yet
// retried by Close (nil if none).
func (c *Core) DeferredErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deferred
}

// finishLocked destroys an owned pool once nothing is live. c.mu is held.
func (c *Core) finishLocked() error {
	if c.destroy == nil || c.destroyed || c.live.Load() > 0 {
		return nil
	}
	if err := c.destroy(); err != nil {
		if errors.Is(err, ErrDeferred) {
			return nil
		}
		return err
	}
	c.destroyed = true
	return nil
}

// Retry runs a destruction that was deferred (see ErrDeferred), if the
// pool is closed, nothing is live and it is not destroyed yet. Its error
// is kept for the next Close, as a deferred destruction's is.
func (c *Core) Retry() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closing {
		return nil
	}
	c.deferred = c.finishLocked()
	c.warnDeferred(c.deferred)
	return c.deferred
}

// IsDestroyed reports whether an owned pool has been destroyed.
func (c *Core) IsDestroyed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.destroyed
}
