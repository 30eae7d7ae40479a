package cuda_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cudamem/cudamem/cuda"
)

func TestGuardCloseWaitsForCallsInFlight(t *testing.T) {
	var g cuda.Guard
	if !g.Enter() {
		t.Fatal("Enter refused on an open Guard")
	}
	if !g.Enter() { // calls nest
		t.Fatal("a nested Enter was refused")
	}
	closed := make(chan bool)
	go func() { closed <- g.Close() }()
	// Close has begun once IsClosed says so; from then Enter refuses.
	for !g.IsClosed() {
		time.Sleep(time.Millisecond)
	}
	if g.Enter() {
		t.Fatal("Enter let a call in after Close began")
	}
	g.Leave()
	select {
	case <-closed:
		t.Fatal("Close returned with a call still in flight")
	case <-time.After(20 * time.Millisecond):
	}
	g.Leave()
	if first := <-closed; !first {
		t.Fatal("the first Close reported false")
	}
	if g.Close() {
		t.Fatal("a second Close reported true")
	}
}

// Many goroutines entering while several close: no call is ever in flight
// after a Close returned, exactly one Close is first, and nothing hangs.
func TestGuardRace(t *testing.T) {
	for round := 0; round < 50; round++ {
		var g cuda.Guard
		var inFlight, closedDone atomic.Int64
		var firsts atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 200; j++ {
					if !g.Enter() {
						continue
					}
					inFlight.Add(1)
					if closedDone.Load() != 0 {
						t.Error("a call is in flight after Close returned")
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
				if g.Close() {
					firsts.Add(1)
				}
				if n := inFlight.Load(); n != 0 {
					t.Errorf("Close returned with %d calls in flight", n)
				}
				closedDone.Store(1)
			}()
		}
		wg.Wait()
		if firsts.Load() != 1 {
			t.Fatalf("%d Closes reported first, want 1", firsts.Load())
		}
	}
}
