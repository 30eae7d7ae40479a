package buffer

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// The garbage-collection safety net.
//
// A runtime.AddCleanup per Buffer costs about as much as the driver's
// whole allocate+free pair on a busy machine (two span-lock round trips,
// plus collector work), and a record of each allocation beside the Buffer
// doubles the garbage. Instead, the Buffers Allocate makes are carved out
// of slabs of about a hundred, and a finalizer watches each slab. It runs
// once no Buffer of the slab is reachable, and reads the Buffers
// themselves (a finalizer, unlike a cleanup, gets its object): it frees
// every allocation whose Buffer was never closed (or disowned) and counts
// it in Leaks. No record is kept besides the Buffer, so a Buffer costs 40
// bytes of heap and nothing else. The cost: a long-lived Buffer keeps its
// slab's memory (4 KiB) alive, and a leaked allocation is freed only when
// its whole slab is collected. For a safety net both are fine.
//
// What the collector does per Buffer is kept small too. A Buffer holds
// one pointer besides its rarely made ext: its home, the resource and
// stream it was allocated with, kept in its slab's header and shared with
// the slab's other Buffers of the same resource and stream. The collector
// skips a pointer into the object it scans at once, so scanning a slab
// costs a load per Buffer, plus the few homes.
//
// A slab reachable from itself is never finalized, and a slab's homes
// keep their resources reachable while any Buffer of the slab is. So a
// resource must never keep a Buffer of a slab: one it keeps (as a
// SubAllocator keeps the blocks it carves allocations from) would share a
// slab with the Buffers it hands out, and a leaked Buffer there would
// reach its resource, the kept Buffer and so its own slab, and be neither
// freed nor counted while the resource lives, nor ever once the resource
// is dropped with it. Buffers made by Owned have no slab (each has a
// finalizer of its own, which costs more but is rare: imports, mappings,
// and what resources keep), and resources keep only those; the
// SubAllocator makes its blocks' Buffers with Owned. A resource written
// outside this module must do the same (AllocatePtr, then Owned) for the
// Buffers it keeps.
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

// Slabs are handed out by cursors, one per P (the runtime's processors:
// at most one goroutine runs on each at a time). A cursor is the P's
// current slab, the next free slot in it, and the home used last. Taking
// a Buffer pins the goroutine to its P for a few instructions (pin), so
// the cursor needs no lock and no atomic operation. Under the race
// detector, which cannot see that pinning orders the goroutines of one P,
// cursors are shards chosen by the goroutine's stack address, each with a
// mutex (cursor_race.go).
//
// A cursor must not keep anything alive for long: its slab keeps the
// leaked Buffers in it from being collected, and the slab's homes keep
// their resources (and whatever a dropped resource holds). So after each
// garbage collection the cursors drop their slabs (gcHook), as a
// sync.Pool drops its contents: what the cursors held is collectable from
// the next collection on.

// slab is a run of Buffers handed out in order, after the homes of the
// Buffers (slabHomes of them at most; a Buffer whose resource and stream
// find no room there gets a home of its own on the heap). It is sized to
// fill a size class of the Go allocator (4 KiB, with the 8-byte header
// the allocator puts before objects of this size that hold pointers).
type slab struct {
	slabHeader
	bufs [slabSize]Buffer
}

type slabHeader struct {
	homes  [slabHomes]home
	nhomes int // homes in use
}

const (
	slabHomes = 4
	slabBytes = 4096 - 8 // a size class, less the allocator's header
	// 99 Buffers of 40 bytes on 64-bit machines.
	slabSize = (slabBytes - int(unsafe.Sizeof(slabHeader{}))) / int(unsafe.Sizeof(Buffer{}))
)

// The slab fits in slabBytes (alignment included).
var _ = [slabBytes - unsafe.Sizeof(slab{})]struct{}{}

func newSlab() *slab {
	s := new(slab)
	runtime.SetFinalizer(s, collectSlab)
	return s
}

// home returns the index of the home of mr and s in the slab, adding it
// if there is room, or -1. Only the slab's cursor, pinned, calls it.
func (sl *slab) home(mr MemoryResource, s *cuda.Stream) int {
	for i := range sl.nhomes {
		if h := &sl.homes[i]; h.stream == s && sameResource(h.mr, mr) {
			return i
		}
	}
	if sl.nhomes == slabHomes {
		return -1
	}
	i := sl.nhomes
	sl.homes[i] = home{mr: mr, stream: s}
	sl.nhomes++
	return i
}

// cursor is a P's (see pin) place in its current slab.
type cursor struct {
	slab atomic.Pointer[slab] // nil: none yet, or dropped by gcHook
	next int                  // the next free slot of slab
	home int                  // the index of the home used last in slab, or -1
	// The resource (its interface words) and stream of that home, to
	// compare with without reading the slab's header. Plain words, so
	// that the cursor keeps nothing alive: they are used only while slab
	// is the slab whose header holds them (and so keeps them alive).
	mrType, mrData uintptr
	stream         uintptr
	lock           cursorLock
	// Each P writes its own cursor on every Allocate: padded to two
	// cache lines so that two Ps' cursors never share one.
	_ [128 - 6*8 - unsafe.Sizeof(cursorLock{})]byte
}

// words returns the two words of an interface value: its type and data
// pointers. (Two word loads: one 16-byte load of the two words just
// stored cannot be forwarded from the store buffer, and stalls.)
func words(mr MemoryResource) (uintptr, uintptr) {
	p := (*[2]uintptr)(unsafe.Pointer(&mr))
	return p[0], p[1]
}

// sameResource reports whether a and b are the same interface value: the
// same dynamic type and the same data word. It never panics, unlike ==
// on dynamic types that are not comparable; equal values in distinct
// boxes are different to it (their Buffers then get homes of their own).
func sameResource(a, b MemoryResource) bool {
	at, ad := words(a)
	bt, bd := words(b)
	return at == bt && ad == bd
}

// newTracked returns a zero Buffer from a slab, and its home, for memory
// of mr allocated on s.
func newTracked(mr MemoryResource, s *cuda.Stream) (*Buffer, *home) {
	t, d := words(mr)
	id := pin()
	if c := cursorOf(id); c != nil && c.next < slabSize && c.home >= 0 && c.mrData == d && c.mrType == t && c.stream == uintptr(unsafe.Pointer(s)) {
		if sl := c.slab.Load(); sl != nil {
			b, h := &sl.bufs[c.next], &sl.homes[c.home]
			c.next++
			unpin(id)
			return b, h
		}
	}
	unpin(id)
	return newTrackedSlow(mr, s)
}

// newTrackedSlow is newTracked when the slab is full or missing, or the
// home is not the last one.
func newTrackedSlow(mr MemoryResource, s *cuda.Stream) (*Buffer, *home) {
	var fresh *slab
	for {
		id := pin()
		c := cursorOf(id)
		if c == nil {
			unpin(id)
			growCursors()
			continue
		}
		sl := c.slab.Load()
		if sl == nil || c.next == slabSize {
			if fresh == nil {
				// Allocate unpinned, then look again: the goroutine may
				// be on another P by then.
				unpin(id)
				fresh = newSlab()
				continue
			}
			sl, fresh = fresh, nil
			c.slab.Store(sl)
			c.next, c.home = 0, -1
		}
		b := &sl.bufs[c.next]
		c.next++
		i := sl.home(mr, s)
		if i >= 0 {
			c.mrType, c.mrData = words(mr)
			c.home, c.stream = i, uintptr(unsafe.Pointer(s))
		}
		unpin(id)
		// fresh, if still set, was not needed: its finalizer finds it
		// empty.
		if i < 0 {
			return b, &home{mr: mr, stream: s}
		}
		return b, &sl.homes[i]
	}
}

// initWord sets the state word of a Buffer that no other goroutine can see
// yet: a plain store, where an atomic one is a locked instruction on some
// machines. The Buffer is published to other goroutines only through
// synchronization (the caller's), and to the finalizer by the collector.
func initWord(b *Buffer, w uint64) {
	*(*uint64)(unsafe.Pointer(&b.word)) = w
}

// gcHook runs after each garbage collection (it is the finalizer of an
// object made for the purpose) and drops the cursors' slabs.
type gcHook struct{ _ *byte }

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
	for i := range s.bufs {
		if b := &s.bufs[i]; b.word.Load()&(ownedBit|closedBit) == ownedBit {
			collectOne(b)
		}
	}
}

// collectOne frees the allocation of a collected Buffer that was never
// closed, unless a host view may still point at it. It is also the
// finalizer of the Buffers made by Owned, which have no slab.
func collectOne(b *Buffer) {
	w := b.word.Load()
	if w&ownedBit == 0 || w&closedBit != 0 {
		return
	}
	b.word.Store(w | closedBit)
	leaks.Add(1)
	if w&viewedBit != 0 {
		leaksKept.Add(1)
		return
	}
	if freeOrFallback(b.h.mr, b.ptr, b.size, b.h.stream) != nil {
		leaksKept.Add(1)
	}
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
