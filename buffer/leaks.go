package buffer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/ownedmem"
)

// The garbage-collection safety net.
//
// A runtime.AddCleanup per Buffer costs about as much as the driver's
// whole allocate+free pair on a busy machine (two span-lock round trips,
// plus collector work), and a record of each allocation beside the Buffer
// doubles the garbage. Instead, owned Buffers are carved out of slabs of
// slabSize, and a finalizer watches each slab. It runs once no Buffer of
// the slab is reachable, and reads the Buffers themselves (a finalizer,
// unlike a cleanup, gets its object): it frees every allocation whose
// Buffer was never closed (or disowned) and counts it in Leaks. No record
// is kept besides the Buffer, so an owned Buffer costs its 56 bytes of
// heap (and a 73rd of the slab's finalizer record) and nothing else. The
// cost: a long-lived Buffer keeps its slab's memory (4 KiB) alive, and a
// leaked allocation is freed only when its whole slab is collected. For a
// safety net both are fine.
//
// A slab reachable from itself is never finalized. So Close (and Disown)
// clear the Buffer's resource: a closed Buffer whose SubAllocator holds
// its block's Buffer in the same slab would otherwise keep the slab
// alive. A leaked (never closed) Buffer whose resource holds Buffers of
// the same slab (a SubAllocator's block Buffers often are: they are made
// just before the allocation carved from them) is neither freed nor
// counted while that resource lives, nor ever if the resource is dropped
// with it: Close resources, and count on the net for Buffers only.
//
// The net never frees memory a host view may still point at: a []byte
// from Buffer.Bytes does not keep the Buffer alive (the collector does not
// follow pointers into memory it did not allocate), so once Bytes has
// handed one out the allocation is marked viewed (viewedBit), and a leaked
// viewed allocation is counted (Leaks, LeaksKept) but left allocated.
// Explicit Close still frees: closing is the caller's promise that no view
// is used any more. The mark follows the memory through Disown into the
// next Owned buffer of the same address (see handoff), as when a virtual
// allocation grows in place.

// slabSize fills a 4 KiB size class exactly: a slab has pointers and is
// over 512 bytes, so the allocator puts an 8-byte type header before it,
// and 64 Buffers of 64 bytes and that header took the next class (4864
// bytes, 12 bytes a Buffer wasted).
const slabSize = (4096 - 8) / int(unsafe.Sizeof(Buffer{}))

type slab [slabSize]Buffer

// inheritViewed returns viewedBit if a disowned viewed allocation left its
// mark at ptr (and takes the mark), else 0.
func inheritViewed(ptr cuda.DevicePtr) uint64 {
	if handoffs.Load() > 0 {
		if _, ok := handoff.LoadAndDelete(ptr); ok {
			handoffs.Add(-1)
			return viewedBit
		}
	}
	return 0
}

// markViewed records that a host view of root r's memory was handed out.
func (r *Buffer) markViewed() {
	if r.word.Load()&viewedBit == 0 {
		r.word.Or(viewedBit)
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

// handOff passes a disowned allocation's viewed mark (word w) to the next
// owner of the address.
func handOff(ptr cuda.DevicePtr, w uint64) {
	if w&viewedBit != 0 {
		if _, loaded := handoff.LoadOrStore(ptr, struct{}{}); !loaded {
			handoffs.Add(1)
		}
	}
}

// cursor hands out the next Buffer of a slab: one per P (cursor_norace.go;
// shards under the race detector), so that making a Buffer takes no lock
// and no atomic read-modify-write.
type cursor struct {
	// slab is read and written by the cursor's owner (pinned), and set
	// to nil by dropSlabs from any goroutine: an owner that raced with it
	// uses the old slab once more, which is harmless.
	slab atomic.Pointer[slab]
	next int
	// Each P writes its cursor on every Owned: padded to two cache lines
	// so that two Ps' cursors, side by side in one array, never share one
	// (a GPU-host profile at 16 goroutines put a tenth of the pair's time
	// in Owned's writes to its cursor when they did).
	_ [128 - unsafe.Sizeof(atomic.Pointer[slab]{}) - unsafe.Sizeof(int(0))]byte
}

// newTracked returns a zero Buffer from a slab.
func newTracked() *Buffer {
	c := pin()
	if c != nil && c.next < slabSize {
		if s := c.slab.Load(); s != nil {
			b := &s[c.next]
			c.next++
			unpin(c)
			return b
		}
	}
	unpin(c)
	return newTrackedSlow()
}

// newTrackedSlow starts a new slab for the calling goroutine's cursor.
// The slab is made unpinned (allocation may block); the goroutine may be
// on another P by the time it is installed, whose slab it then replaces,
// leaving that slab's unused slots zero (collectSlab skips them).
func newTrackedSlow() *Buffer {
	s := new(slab)
	runtime.SetFinalizer(s, collectSlab)
	for {
		c := pin()
		if c == nil {
			unpin(c)
			growCursors()
			continue
		}
		c.slab.Store(s)
		c.next = 1
		unpin(c)
		return &s[0]
	}
}

// dropSlabs makes every cursor start a new slab at its next use. It runs
// after a garbage collection, at most once per cycle (armGCHook; the
// finalizer goroutine may fold two cycles into one run), so that a slab
// whose P makes no more Buffers does not stay reachable through its
// cursor, keeping the net from its leaked Buffers, for good: as with
// sync.Pool, which the cursors were before, a slab is given up about one
// cycle after its last Buffer was handed out.
func dropSlabs() {
	eachCursor(func(c *cursor) {
		if c.slab.Load() != nil {
			c.slab.Store(nil)
		}
	})
}

// gcHook is an object made only to be collected: its finalizer runs after
// the collection that finds it, drops the cursors' slabs and makes the
// next hook, for the next collection.
type gcHook struct {
	_ *byte // a pointer keeps it out of the tiny allocator, whose objects share finalizers
	_ [8]byte
}

func armGCHook() {
	runtime.SetFinalizer(&gcHook{}, func(*gcHook) {
		dropSlabs()
		armGCHook()
	})
}

func init() { armGCHook() }

// collectSlab frees the allocations of a collected slab whose Buffers were
// never closed, except those a host view may still point at. Slots never
// handed out are zero (no ownedBit). A held Buffer is never here: the Hold
// keeps it reachable.
func collectSlab(s *slab) {
	for i := range s {
		b := &s[i]
		w := b.word.Load()
		if w&ownedBit == 0 || w&closedBit != 0 {
			continue
		}
		b.word.Store(w | closedBit)
		leaks.Add(1)
		if w&viewedBit != 0 {
			leaksKept.Add(1)
			continue
		}
		// A free that failed after the memory was gone (ErrPartlyFreed)
		// freed it: only a free that left it allocated keeps it.
		if err := netFree(b, w); err != nil && !errors.Is(err, ErrPartlyFreed) {
			leaksKept.Add(1)
		}
	}
}

// errFreePanicked stands for a free whose resource panicked in the safety
// net.
var errFreePanicked = errors.New("the resource's Deallocate panicked")

// netFree is the safety net's free of a leaked buffer. It runs on the
// runtime's cleanup goroutine, where a panic would end the program and
// leave the slab's other leaks unfreed: a resource (a user's) whose
// Deallocate panics there keeps that memory, counted in LeaksKept, and
// the net goes on.
func netFree(b *Buffer, w uint64) (err error) {
	defer func() {
		if recover() != nil {
			err = errFreePanicked
		}
	}()
	return freeOrFallback(b.mr, b.ptr, b.size, b.stream, w)
}

// freeOrFallback frees on s, or, only if s is closed by now, on the
// resource's default stream (nil). A free refused for any other reason (s
// capturing now, say) must not turn into a free on the legacy stream,
// unordered after the work on s; nor one that freed part of the memory
// (ErrPartlyFreed) into a second free. When the fallback fails too, the
// error holds both, so that it wraps ErrPartlyFreed if the fallback's
// free got that far: the memory is gone then, and no caller may count it
// as allocated or free it again.
func freeOrFallback(mr MemoryResource, p cuda.DevicePtr, n uint64, s *cuda.Stream, w uint64) error {
	err := deallocate(mr, p, n, s, w)
	if err != nil && s != nil && errors.Is(err, cuda.ErrClosed) && !errors.Is(err, ErrPartlyFreed) {
		ferr := deallocate(mr, p, n, nil, w)
		if ferr == nil {
			return nil
		}
		return fmt.Errorf("%w; then on the default stream: %w", err, ferr)
	}
	return err
}

// deallocate frees an owned buffer's memory (w its state word) through its
// resource: through package ownedmem if Allocate made it that way, else
// with the resource's Deallocate.
func deallocate(mr MemoryResource, p cuda.DevicePtr, n uint64, s *cuda.Stream, w uint64) error {
	if w&unrecordedBit != 0 {
		if ok, err := ownedmem.Free(mr, p, n, s); ok {
			return err
		}
	}
	return mr.Deallocate(p, n, s)
}
