//go:build !race

package buffer

import (
	"runtime"
	"sync/atomic"
	_ "unsafe" // go:linkname
)

// procPin pins the calling goroutine to its P (no preemption until
// procUnpin) and returns the P's id: sync.Pool's own way to per-P data,
// without sync.Pool's Get and Put around it. The runtime keeps both
// linkable for packages outside the standard library.
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// perP holds one cursor per P, indexed by the P's id; growCursors makes it,
// and replaces it when GOMAXPROCS grows (dropping the old cursors' slabs).
var perP atomic.Pointer[[]cursor]

func init() { growCursors() }

// pin pins the goroutine to its P and returns its cursor, or nil if the P
// has none yet (GOMAXPROCS grew: unpin, growCursors, pin again). unpin
// must follow soon: nothing between may block or allocate.
func pin() *cursor {
	id := procPin()
	if p := perP.Load(); p != nil && uint(id) < uint(len(*p)) {
		return &(*p)[id]
	}
	return nil
}

func unpin(*cursor) { procUnpin() }

func growCursors() {
	for {
		old := perP.Load()
		n := runtime.GOMAXPROCS(0)
		if old != nil && len(*old) >= n {
			return
		}
		cs := make([]cursor, n)
		if perP.CompareAndSwap(old, &cs) {
			return
		}
	}
}

// eachCursor calls f on every cursor (f must be safe against the cursor's
// owner, which is not locked out).
func eachCursor(f func(*cursor)) {
	if p := perP.Load(); p != nil {
		for i := range *p {
			f(&(*p)[i])
		}
	}
}
