package cuda

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lock holds calls off until unlock decides: unlock(false) lets the
// waiting calls in (the handle stayed open), unlock(true) refuses them.
func TestGuardLockUnlock(t *testing.T) {
	for _, close := range []bool{false, true} {
		var g Guard
		if !g.Enter() {
			t.Fatal("Enter refused on an open Guard")
		}
		locked := make(chan bool)
		go func() { locked <- g.lock() }()
		select {
		case <-locked:
			t.Fatal("Lock returned with a call in flight")
		case <-time.After(20 * time.Millisecond):
		}
		entered := make(chan bool)
		go func() {
			ok := g.Enter()
			if ok {
				g.Leave()
			}
			entered <- ok
		}()
		g.Leave()
		if was := <-locked; was {
			t.Fatal("Lock reported an open Guard closed")
		}
		select {
		case <-entered:
			t.Fatal("Enter went ahead while the Guard was locked")
		case <-time.After(20 * time.Millisecond):
		}
		g.unlock(close)
		if ok := <-entered; ok == close {
			t.Fatalf("after Unlock(%v), Enter returned %v", close, ok)
		}
		if g.IsClosed() != close {
			t.Fatalf("after Unlock(%v), IsClosed is %v", close, g.IsClosed())
		}
		if was := g.lock(); was != close {
			t.Fatalf("a second Lock reported closed=%v after Unlock(%v)", was, close)
		}
		g.unlock(close)
	}
}

// Many goroutines entering while several lock, unlock and close: calls and
// locks never overlap, and nothing hangs.
func TestGuardLockRace(t *testing.T) {
	var g Guard
	var inFlight, locked atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 300; j++ {
				if !g.Enter() {
					return
				}
				inFlight.Add(1)
				if locked.Load() != 0 {
					t.Error("a call is in flight while the Guard is locked")
				}
				inFlight.Add(-1)
				g.Leave()
			}
		}()
	}
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				g.lock()
				if locked.Add(1) != 1 || inFlight.Load() != 0 {
					t.Error("two Locks, or a Lock and a call, overlap")
				}
				locked.Add(-1)
				g.unlock(i == 2 && j == 49)
			}
		}()
	}
	wg.Wait()
}
