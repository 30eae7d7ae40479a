package buffer

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cudamem/cudamem/cuda"
)

// The garbage-collection safety net.
//
// A runtime.AddCleanup per Buffer costs about as much as the driver's
// whole allocate+free pair on a busy machine (two span-lock round trips,
// plus collector work). Instead, owned Buffers are carved out of slabs of
// slabSize, and one cleanup watches each slab. The cleanup runs once no
// Buffer of the slab is reachable; it then frees every allocation whose
// Buffer was never closed (or disowned) and counts it in Leaks. The cost:
// a long-lived Buffer keeps its slab's memory (a few KiB) alive, and a
// leaked allocation is freed only when its whole slab is collected. For a
// safety net both are fine.

const slabSize = 64

type slab [slabSize]Buffer

// tracked is the safety net's record of one owned allocation. It lives in
// a ledger separate from the slab, so the slab's cleanup can read it
// without keeping the slab reachable.
type tracked struct {
	live   atomic.Bool // set while the allocation is owned by an open Buffer
	ptr    cuda.DevicePtr
	size   uint64
	mr     MemoryResource
	stream *cuda.Stream
}

type ledger [slabSize]tracked

// track records an allocation; the fields are written before live is set,
// and the cleanup reads them only after seeing live, so the write happens
// before the read.
func (t *tracked) track(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream) {
	t.ptr, t.size, t.mr, t.stream = ptr, size, mr, s
	t.live.Store(true)
}

// stop marks the allocation as no longer the net's concern (closed or
// disowned). A nil t (buffers that own nothing) is fine.
func (t *tracked) stop() {
	if t != nil {
		t.live.Store(false)
	}
}

// cursor hands out the next Buffer of a slab. Cursors are cached per P.
type cursor struct {
	slab   *slab
	ledger *ledger
	next   int
}

var cursors = sync.Pool{New: func() any { return new(cursor) }}

// newTracked returns a zero Buffer from a slab and its ledger entry.
func newTracked() (*Buffer, *tracked) {
	c := cursors.Get().(*cursor)
	if c.slab == nil || c.next == slabSize {
		c.slab, c.ledger, c.next = new(slab), new(ledger), 0
		runtime.AddCleanup(&c.slab[0], collectSlab, c.ledger)
	}
	b, t := &c.slab[c.next], &c.ledger[c.next]
	c.next++
	cursors.Put(c)
	return b, t
}

// collectSlab frees the allocations of a collected slab whose Buffers were
// never closed.
func collectSlab(l *ledger) {
	for i := range l {
		t := &l[i]
		if !t.live.Load() {
			continue
		}
		t.live.Store(false)
		leaks.Add(1)
		if err := t.mr.Deallocate(t.ptr, t.size, t.stream); err != nil && t.stream != nil {
			// The allocation stream may be gone by now: free on the default one.
			_ = t.mr.Deallocate(t.ptr, t.size, nil)
		}
	}
}
