//go:build !race

package buffer

import (
	"runtime"
	"sync/atomic"
	_ "unsafe" // go:linkname
)

// procPin pins the calling goroutine to its P (no preemption until
// procUnpin) and returns the P's id: sync.Pool's way to per-P data. The
// runtime keeps both linkable for packages outside the standard library
// (go.dev/issue/67401).
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// cursorLock is nothing: a pinned goroutine has its P's cursor to itself.
type cursorLock struct{}

// cursors holds one cursor per P, indexed by the P's id (below
// GOMAXPROCS); growCursors replaces it when GOMAXPROCS grows.
var cursors atomic.Pointer[[]cursor]

func init() { growCursors() }

// pin pins the goroutine to its P and returns the P's id, which names
// its cursor (cursorOf). unpin must follow, soon: the goroutine cannot be
// preempted meanwhile, so nothing between may block or allocate.
func pin() int { return procPin() }

func unpin(int) { procUnpin() }

// cursorOf returns the cursor of P id, or nil if there is none yet for it
// (GOMAXPROCS grew: call growCursors).
func cursorOf(id int) *cursor {
	if cs := *cursors.Load(); uint(id) < uint(len(cs)) {
		return &cs[id]
	}
	return nil
}

// growCursors makes a cursor for each P. The cursors it replaces are
// dropped, with what they held.
func growCursors() {
	for {
		old := cursors.Load()
		n := runtime.GOMAXPROCS(0)
		if old != nil && len(*old) >= n {
			return
		}
		cs := make([]cursor, n)
		for i := range cs {
			cs[i].home = -1
		}
		if cursors.CompareAndSwap(old, &cs) {
			return
		}
	}
}

// dropSlabs makes every cursor start a new slab at its next use.
func dropSlabs() {
	cs := *cursors.Load()
	for i := range cs {
		if cs[i].slab.Load() != nil {
			cs[i].slab.Store(nil)
		}
	}
}
