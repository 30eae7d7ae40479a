package poolcore

import (
	"errors"
	"sync"
	"sync/atomic"
)

// ErrDeferred, returned (or wrapped) by a destroy function, means the
// destruction cannot run now and the function has arranged for Retry to
// be called once it can. It is not a failure: Close returns nil, and the
// pool counts as closed but not yet destroyed.
var ErrDeferred = errors.New("poolcore: destruction deferred")

// closedBit marks state once Close has begun; the bits below it count the
// calls in progress (between Acquire and Release).
const closedBit = 1 << 62

// Core is the lifecycle of one driver pool. Its methods are safe for
// concurrent use.
type Core struct {
	state atomic.Int64 // closedBit | calls in progress
	live  atomic.Int64 // allocations made and not yet freed

	mu        sync.Mutex // serializes Close, destruction, and Close's wait
	idle      sync.Cond  // signalled when the last call ends after Close began; L is &mu
	closing   bool       // Close finished waiting for calls: Freed may destroy from now on
	destroyed bool
	destroy   func() error // nil: nothing to destroy (a borrowed pool)
	deferred  error        // the error of a destruction Freed attempted
}

// SetDestroy makes c own its pool: fn destroys it, once, when c is closed
// and nothing is live. Call it before c is shared.
func (c *Core) SetDestroy(fn func() error) { c.destroy = fn }

// Owned reports whether c destroys its pool on Close (SetDestroy was given
// a function).
func (c *Core) Owned() bool { return c.destroy != nil }

// Acquire starts a call on the pool: it returns false once Close has
// begun (nothing to release then), and true otherwise, after which
// Release must follow. It never blocks.
func (c *Core) Acquire() bool {
	// One atomic add on the fast path (what RWMutex.RLock costs). After
	// Close began the increment is undone at once; Close, waiting for the
	// count to drain, at worst waits for that undo.
	if c.state.Add(1)&closedBit != 0 {
		c.Release()
		return false
	}
	return true
}

// Release ends a call started by a successful Acquire. The last call to
// end after Close began wakes Close.
func (c *Core) Release() {
	if c.state.Add(-1) == closedBit {
		c.mu.Lock()
		c.idle.L = &c.mu
		c.idle.Broadcast()
		c.mu.Unlock()
	}
}

// Allocated counts one more live allocation. Call it between Acquire and
// Release, after the allocation succeeded, so that Close (which waits for
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
			// Close sets closedBit before it looks at the live count, so
			// if it is not set yet, Close will see this free: only the
			// last free of a closing pool takes the lock.
			if n > 1 || c.state.Load()&closedBit == 0 {
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
	return err
}

// Close marks the pool closed (later Acquires fail), waits for the calls
// in progress to end, then destroys an owned pool if nothing is live (else
// the last Freed does). It returns the destruction's error, or that of a
// deferred destruction that failed and fails again; calling Close again
// retries. Close must not be called from inside a call on the same pool
// (between Acquire and Release): it would wait for itself.
func (c *Core) Close() error {
	for {
		s := c.state.Load()
		if s&closedBit != 0 || c.state.CompareAndSwap(s, s|closedBit) {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle.L = &c.mu
	for c.state.Load() != closedBit {
		c.idle.Wait()
	}
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
	return c.deferred
}

// IsClosed reports whether Close has begun.
func (c *Core) IsClosed() bool { return c.state.Load()&closedBit != 0 }

// IsDestroyed reports whether an owned pool has been destroyed.
func (c *Core) IsDestroyed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.destroyed
}
