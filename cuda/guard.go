package cuda

import (
	"sync"
	"sync/atomic"
)

// Guard is the lifecycle every cudamem handle shares: many goroutines make
// calls, one closes, and Close waits for the calls in flight. Each call
// brackets its use of the handle with Enter and Leave; once Close has begun,
// Enter refuses, and when Close returns no call is in flight and none can
// start, so the caller may destroy what the handle owns.
//
// cudamem's handles all use it; it is exported for resources written
// outside cudamem that wrap a handle the same way. The zero Guard is open
// and ready; it must not be copied after first use. Enter and Leave cost
// one atomic add each.
type Guard struct {
	state atomic.Int64 // guardClosed | guardClosing | calls in flight
	mu    sync.Mutex   // the waits of Close, lock and of Enter while locked
	idle  sync.Cond    // broadcast when the last call leaves a closing Guard, and at unlock; L is &mu
}

// The state's high bits: Close has begun (for good), or a lock holds calls
// off until its unlock decides. The bits below count the calls in flight.
const (
	guardClosed  = 1 << 62
	guardClosing = 1 << 61
	guardCalls   = guardClosing - 1
)

// Enter starts a call: it returns false once Close has begun (there is
// nothing to Leave then), and true otherwise, after which Leave must
// follow. It does not block, except while a lock holds calls off: it then
// waits for the unlock, and is refused if that closed the Guard. Calls may
// nest, but not across a lock (the lock would wait for the outer call, and
// the inner one for the lock).
func (g *Guard) Enter() bool {
	if g == nil {
		return false
	}
	for {
		s := g.state.Add(1)
		if s&(guardClosed|guardClosing) == 0 {
			return true
		}
		g.Leave() // undo at once: a Close or lock waiting for the count waits at most for this
		if s&guardClosed != 0 {
			return false
		}
		g.mu.Lock()
		g.idle.L = &g.mu
		for g.state.Load()&guardClosing != 0 {
			g.idle.Wait()
		}
		g.mu.Unlock()
	}
}

// Leave ends a call that Enter let in. The last call to leave while a
// Close or lock waits wakes it.
func (g *Guard) Leave() {
	if g == nil {
		return
	}
	if s := g.state.Add(-1); s&guardCalls == 0 && s&(guardClosed|guardClosing) != 0 {
		g.broadcast()
	}
}

func (g *Guard) broadcast() {
	g.mu.Lock()
	g.idle.L = &g.mu
	g.idle.Broadcast()
	g.mu.Unlock()
}

// Close refuses later calls at once, then waits until the calls in flight
// have left. It reports whether this was the first Close; every Close
// waits, so the caller whose Close returned true may destroy the handle's
// resources. Close must not be called between an Enter and its Leave on
// the same Guard: it would wait for itself.
func (g *Guard) Close() (first bool) {
	if g == nil {
		return false
	}
	for {
		s := g.state.Load()
		if s&guardClosed != 0 {
			break
		}
		if g.state.CompareAndSwap(s, s|guardClosed) {
			first = true
			break
		}
	}
	g.mu.Lock()
	g.idle.L = &g.mu
	for g.state.Load()&guardCalls != 0 {
		g.idle.Wait()
	}
	g.mu.Unlock()
	return first
}

// lock is the first half of a Close that may fail: it waits until no call
// is in flight and holds new ones off (their Enter waits) until unlock. It
// reports whether the Guard was closed already. Between the two the caller
// alone uses the handle: it destroys what the handle owns, then calls
// unlock(true) to close the Guard for good, or unlock(false) if the
// destruction failed and the handle stays open. locks exclude each other.
// Like Close, lock must not be called between an Enter and its Leave.
func (g *Guard) lock() (closed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.idle.L = &g.mu
	for {
		s := g.state.Load()
		if s&guardClosing != 0 {
			g.idle.Wait() // another lock holds the Guard
			continue
		}
		if g.state.CompareAndSwap(s, s|guardClosing) {
			closed = s&guardClosed != 0
			break
		}
	}
	for g.state.Load()&guardCalls != 0 {
		g.idle.Wait()
	}
	return closed
}

// unlock ends what lock began: with close, the Guard is closed for good and
// the calls waiting in Enter are refused; without, they go ahead.
func (g *Guard) unlock(close bool) {
	for {
		s := g.state.Load()
		n := s &^ guardClosing
		if close {
			n |= guardClosed
		}
		if g.state.CompareAndSwap(s, n) {
			break
		}
	}
	g.broadcast()
}

// IsClosed reports whether Close has begun, or an unlock(true) closed the
// Guard.
func (g *Guard) IsClosed() bool { return g == nil || g.state.Load()&guardClosed != 0 }

// closeHandle is the Close that events, modules and graphs share, under
// g's lock: once only (a later Close returns *died again); after
// Context.Close destroyed dev's context it only marks the handle closed,
// keeping in *died what diedWith says of it, since nothing of that context
// may reach the driver; otherwise destroy runs in the context, and if it
// fails the handle stays open and the error is returned.
func closeHandle(g *Guard, dev *Device, op, what string, handle uintptr, died *error, destroy func(ctx uintptr) error) error {
	if g.lock() {
		g.unlock(true)
		return *died
	}
	if dev.contextClosedDone() {
		*died = dev.diedWith(op, what, handle)
		g.unlock(true)
		return *died
	}
	ctx, err := dev.contextFor(op)
	if err == nil {
		err = destroy(ctx)
	}
	g.unlock(err == nil)
	return err
}
