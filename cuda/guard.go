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
// Streams, events, modules, graphs, pools, virtual allocations and file
// descriptors all use it. It is exported for resources written outside
// cudamem that wrap a handle the same way.
//
// The zero Guard is open and ready. A Guard must not be copied after first
// use. Enter and Leave cost one atomic add each.
type Guard struct {
	state atomic.Int64 // guardClosed | calls in flight
	mu    sync.Mutex   // the waits of Close
	idle  sync.Cond    // broadcast when the last call leaves a closing Guard; L is &mu
}

// guardClosed marks a Guard whose Close has begun; the bits below count the
// calls in flight.
const guardClosed = 1 << 62

// Enter starts a call: it returns false once Close has begun (there is
// nothing to Leave then), and true otherwise, after which Leave must follow.
// It never blocks. Calls may nest.
func (g *Guard) Enter() bool {
	if g.state.Add(1)&guardClosed != 0 {
		g.Leave() // undo at once: Close, waiting for the count, waits at most for this
		return false
	}
	return true
}

// Leave ends a call that Enter let in. The last call to leave after Close
// began wakes Close.
func (g *Guard) Leave() {
	if g.state.Add(-1) == guardClosed {
		g.mu.Lock()
		g.idle.L = &g.mu
		g.idle.Broadcast()
		g.mu.Unlock()
	}
}

// Close refuses later calls, then waits until the calls in flight have left.
// It reports whether this was the first Close; every Close waits, so any
// caller may destroy the handle's resources once its Close returned true,
// and a later Close that returns false finds them no longer in use.
//
// Close must not be called between an Enter and its Leave on the same
// Guard: it would wait for itself.
func (g *Guard) Close() (first bool) {
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
	for g.state.Load() != guardClosed {
		g.idle.Wait()
	}
	g.mu.Unlock()
	return first
}

// IsClosed reports whether Close has begun.
func (g *Guard) IsClosed() bool { return g.state.Load()&guardClosed != 0 }
