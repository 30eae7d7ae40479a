package ipc

import (
	"runtime"
	"testing"
	"weak"

	"github.com/cudamem/cudamem/resource"
)

// TestPoolStateSweep: entries of collected pools leave the export-state
// map, but only when it has doubled since the last sweep, so that making
// a new pool's state does not cost time in proportion to the pools made
// before it. Pools still reachable keep their state (and UUID).
func TestPoolStateSweep(t *testing.T) {
	exported.Lock()
	saved, savedAt := exported.pools, exported.sweepAt
	exported.pools, exported.sweepAt = map[any]*exportState{}, 0
	exported.Unlock()
	t.Cleanup(func() {
		exported.Lock()
		exported.pools, exported.sweepAt = saved, savedAt
		exported.Unlock()
	})
	keep := new(resource.DevicePool) // reachable: its state must stay
	st, err := poolState("test", keep)
	if err != nil {
		t.Fatal(err)
	}
	dead := func(n int) {
		exported.Lock()
		defer exported.Unlock()
		for range n {
			exported.pools[weak.Make(new(resource.DevicePool))] = &exportState{}
		}
	}
	size := func() (int, int) {
		exported.Lock()
		defer exported.Unlock()
		return len(exported.pools), exported.sweepAt
	}
	if n, at := size(); n != 1 || at != minSweep {
		t.Fatalf("after the first state: %d entries, sweep at %d; want 1, %d", n, at, minSweep)
	}
	dead(minSweep - 2)
	runtime.GC()
	// Below the threshold: no sweep, the dead entries stay.
	if _, err := poolState("test", new(resource.DevicePool)); err != nil {
		t.Fatal(err)
	}
	if n, _ := size(); n != minSweep {
		t.Fatalf("%d entries below the threshold, want %d (no sweep)", n, minSweep)
	}
	// At the threshold: the collected pools go, the live one stays.
	p2 := new(resource.DevicePool)
	if _, err := poolState("test", p2); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(p2)
	if n, at := size(); n > 3 || at != minSweep {
		t.Fatalf("after the sweep: %d entries, sweep at %d; want at most 3, %d", n, at, minSweep)
	}
	again, err := poolState("test", keep)
	if err != nil {
		t.Fatal(err)
	}
	if again != st {
		t.Fatal("a live pool's state was swept away")
	}
	runtime.KeepAlive(keep)
}
