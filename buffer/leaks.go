package buffer

import (
	"errors"
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
//
// The net never frees memory a host view may still point at: a []byte
// from Buffer.Bytes does not keep the Buffer alive (the collector does not
// follow pointers into memory it did not allocate), so once Bytes has
// handed one out the allocation is marked viewed, and a leaked viewed
// allocation is counted (Leaks, LeaksKept) but left allocated. Explicit
// Close still frees: closing is the caller's promise that no view is used
// any more. The mark follows the memory through Disown into the next
// Owned buffer of the same address (see handoff), as when a virtual
// allocation grows in place.

const slabSize = 64

type slab [slabSize]Buffer

// tracked is the safety net's record of one owned allocation. It lives in
// a ledger separate from the slab, so the slab's cleanup can read it
// without keeping the slab reachable.
type tracked struct {
	live   atomic.Bool // set while the allocation is owned by an open Buffer
	viewed atomic.Bool // a host view (Bytes) was handed out: never free it
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
	if handoffs.Load() > 0 {
		if _, ok := handoff.LoadAndDelete(ptr); ok {
			handoffs.Add(-1)
			t.viewed.Store(true)
		}
	}
	t.live.Store(true)
}

// markViewed records that a host view of the allocation was handed out.
func (t *tracked) markViewed() {
	if t != nil && !t.viewed.Load() {
		t.viewed.Store(true)
	}
}

// handoff holds the addresses of viewed allocations that were disowned:
// the next Owned buffer at such an address inherits the mark. handoffs
// counts the entries, so that Owned pays one atomic load while there are
// none. An entry whose memory is freed some other way stays until an
// allocation at that address comes along; it then only keeps the net from
// freeing that allocation if it leaks (a leak, never a use after free).
var (
	handoff  sync.Map // cuda.DevicePtr -> struct{}
	handoffs atomic.Int64
)

// disown stops the net for an allocation whose memory moves on, passing
// its viewed mark to the next owner of the address.
func (t *tracked) disown(ptr cuda.DevicePtr) {
	if t == nil {
		return
	}
	if t.viewed.Load() {
		if _, loaded := handoff.LoadOrStore(ptr, struct{}{}); !loaded {
			handoffs.Add(1)
		}
	}
	t.live.Store(false)
	t.forget()
}

// stop marks the allocation as no longer the net's concern (closed or
// disowned). A nil t (buffers that own nothing) is fine.
func (t *tracked) stop() {
	if t != nil {
		t.live.Store(false)
		t.forget()
	}
}

// forget drops the record's references once the net no longer needs them.
// The slab's cleanup gets the ledger as its argument, and a ledger entry
// that kept its resource (a SubAllocator, say, holding its blocks' Buffers
// from the same slab) could keep the slab reachable from the cleanup's own
// argument, so that it never ran. The cleanup reads these fields only of
// entries it sees live, and it cannot run while this Buffer's slab is
// reachable, so clearing them here races with nothing.
func (t *tracked) forget() {
	t.mr, t.stream = nil, nil
}

// cursor hands out the next Buffer of a slab. Cursors are cached per P.
type cursor struct {
	slab   *slab
	ledger *ledger
	next   int
	// Each P writes its cursor on every Owned: padded to two cache lines
	// so that two Ps' cursors, allocated side by side, never share one
	// (a GPU-host profile at 16 goroutines put a tenth of the pair's time
	// in Owned's writes to its cursor before).
	_ [128 - 3*8]byte
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
// never closed, except those a host view may still point at.
func collectSlab(l *ledger) {
	for i := range l {
		t := &l[i]
		if !t.live.Load() {
			continue
		}
		t.live.Store(false)
		leaks.Add(1)
		if t.viewed.Load() {
			leaksKept.Add(1)
			continue
		}
		if !freeLeaked(t) {
			leaksKept.Add(1)
		}
	}
}

// freeLeaked frees a leaked allocation on its allocation stream, or, if
// that stream is closed by now, on the resource's default stream.
func freeLeaked(t *tracked) bool {
	return freeOrFallback(t.mr, t.ptr, t.size, t.stream) == nil
}

// freeOrFallback frees on s, or, only if s is closed by now, on the
// resource's default stream (nil). A free refused for any other reason (s
// capturing now, say) must not turn into a free on the legacy stream,
// unordered after the work on s; nor one that freed part of the memory
// (ErrPartlyFreed) into a second free.
func freeOrFallback(mr MemoryResource, p cuda.DevicePtr, n uint64, s *cuda.Stream) error {
	err := mr.Deallocate(p, n, s)
	if err != nil && s != nil && errors.Is(err, cuda.ErrClosed) && !errors.Is(err, ErrPartlyFreed) {
		if mr.Deallocate(p, n, nil) == nil {
			return nil
		}
	}
	return err
}
