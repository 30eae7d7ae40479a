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
// plus collector work). Instead, the Buffers Allocate makes are carved out
// of slabs of about a hundred, and one cleanup watches each slab. A
// cleanup does not get its object (the object is gone when it runs), so
// each slab has a ledger beside it, its side, which the cleanup gets
// instead: for each Buffer of the slab, whether it is open (allocated and
// not yet closed or disowned) and whether a host view was taken, its
// address and size, and its home (the resource and stream it was
// allocated with; the slab's Buffers of one resource and stream share
// one). Allocate fills the Buffer's entry, Close and Disown clear its
// open flag, both with plain stores: the entry is the Buffer's alone, and
// written only by its allocator, the first Bytes (see markViewed) and its
// closer, in that order. When no Buffer of the slab is reachable, the
// cleanup frees every allocation still open and counts it in Leaks. (A
// size too large for an entry, past 2^56 bytes, which no memory has, gets
// an Owned Buffer instead.)
//
// A finalizer could read the Buffers themselves, with no ledger, but the
// collector must then scan every finalizable slab for the pointers in its
// Buffers, and keep each dead slab for a cycle more; the cleanup's ledger
// is mostly plain numbers, and the slab is freed at once. Per Buffer, the
// slab and its side cost about 60 bytes of heap and a few stores. The
// cost: a long-lived Buffer keeps its slab's memory (6 KiB, with the side)
// alive, and a leaked allocation is freed only when its whole slab is
// collected. For a safety net both are fine. (Recycling the sides of
// collected slabs saves their allocation but was slower: their memory is
// cold when refilled, where a new side's was just cleared.)
//
// A slab reachable from its side is never collected (the side, the
// cleanup's argument, stays reachable until the cleanup runs), and the
// side's homes keep their resources reachable. So a resource must never
// keep a Buffer of a slab: one it keeps (as a SubAllocator keeps the
// blocks it carves allocations from) would share a slab with the Buffers
// it hands out, and the slab would reach itself through the resource:
// none of its leaked Buffers would ever be freed or counted. Buffers made
// by Owned have no slab (each has a finalizer of its own, which costs
// more but is rare: imports, mappings, and what resources keep), and
// resources keep only those; the SubAllocator makes its blocks' Buffers
// with Owned. A resource written outside this module must do the same
// (AllocatePtr, then Owned) for the Buffers it keeps.
//
// The net never frees memory a host view may still point at: a []byte
// from Buffer.Bytes does not keep the Buffer alive (the collector does not
// follow pointers into memory it did not allocate), so once Bytes has
// handed one out the allocation is marked viewed (viewedBit, and in the
// side), and a leaked viewed allocation is counted (Leaks, LeaksKept) but
// left allocated. Explicit Close still frees: closing is the caller's
// promise that no view is used any more. The mark follows the memory
// through Disown into the next Owned buffer of the same address (see
// handoff), as when a virtual allocation grows in place.

// inheritViewed returns viewedBit if a disowned viewed allocation left its
// mark at ptr (and takes the mark), else 0.
// Callers check handoffs first.
func inheritViewed(ptr cuda.DevicePtr) uint64 {
	if _, ok := handoff.LoadAndDelete(ptr); ok {
		handoffs.Add(-1)
		return viewedBit
	}
	return 0
}

// markViewed records that a host view of root r's memory was handed out.
// Only the call that sets viewedBit writes the side's entry, within a call
// on r: after the allocator's write, before the closer's.
func (r *Buffer) markViewed() {
	if r.word.Load()&viewedBit == 0 {
		if w := r.word.Or(viewedBit); w&viewedBit == 0 {
			if e := r.entry(w); e != nil {
				e.meta |= metaViewed
			}
		}
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
// leaked Buffers in it from being collected, and the homes in the slab's
// side keep their resources (and whatever a dropped resource holds). So
// after each garbage collection the cursors drop their slabs (gcHook), as
// a sync.Pool drops its contents: what the cursors held is collectable
// from the next collection on.

// slab is a run of Buffers handed out in order, and a pointer to its
// side. It is sized to fill a size class of the Go allocator (4 KiB, with
// the 8-byte header the allocator puts before objects of this size that
// hold pointers). A Buffer of a slab points to its slab, and finds its
// entry and home in the side by the indexes its state word holds. (Its
// slot alone, with its own address, would name its slab and save the
// pointer; but a copy of the Buffer, which Go allows, would then name
// memory that is no slab.)
type slab struct {
	side *slabSide
	bufs [slabSize]Buffer
}

// slabSide is a slab's ledger (see above): the homes of its Buffers
// (slabHomes of them at most: a cursor starts a new slab for a resource
// and stream that find no room), then an entry per Buffer. The homes, the
// only pointers, come first, so the collector scans only them.
type slabSide struct {
	homes  [slabHomes]home
	nhomes int // homes in use
	ents   [slabSize]entry
}

// entry is what the net needs of one Buffer of a slab: its address, and
// its size with the entry's meta in the top byte (one cache line holds
// four entries: a Buffer's allocation and close each write one word or
// two of it). Sizes above maxTracked do not fit: Allocate gives such
// Buffers (which no device can have) no slab.
type entry struct {
	ptr  cuda.DevicePtr
	meta uint64
}

// An entry's meta, above its size: open, viewed, and the index of its
// home.
const (
	metaOpen   = 1 << 63 // allocated, and not closed or disowned
	metaViewed = 1 << 62 // a host view was handed out: never freed by the net
	metaShift  = 56      // the home's index
	metaHome   = slabHomes - 1
	maxTracked = 1<<metaShift - 1
)

const (
	slabHomes = 8 // a power of two, at most 8 (homeShift) and 64 (metaHome)
	slabBytes = 4096 - 8
	// bufferBytes is unsafe.Sizeof(Buffer{}), which the types cannot
	// name (a Buffer refers to its slab): three 64-bit words and two
	// pointers.
	bufferBytes = 3*8 + 2*unsafe.Sizeof(uintptr(0))
	// 102 Buffers of 40 bytes on 64-bit machines, at most 255 (slotShift).
	slabSize = (slabBytes - 8) / int(bufferBytes)
)

// The slab fits in slabBytes (alignment included); TestSlabSizes checks
// the side.
var (
	_ [bufferBytes - unsafe.Sizeof(Buffer{})]struct{}
	_ [unsafe.Sizeof(Buffer{}) - bufferBytes]struct{}
	_ [slabBytes - unsafe.Sizeof(slab{})]struct{}
)

func newSlab() *slab {
	sl, sd := new(slab), new(slabSide)
	sl.side = sd
	runtime.AddCleanup(sl, collectSide, sd)
	return sl
}

// home returns the index of the home of mr and s in the side, adding it
// if there is room, or -1. Only the slab's cursor, pinned, calls it.
func (sd *slabSide) home(mr MemoryResource, s *cuda.Stream) int {
	for i := range sd.nhomes {
		if h := &sd.homes[i]; h.stream == s && sameResource(h.mr, mr) {
			return i
		}
	}
	if sd.nhomes == slabHomes {
		return -1
	}
	i := sd.nhomes
	sd.homes[i] = home{mr: mr, stream: s}
	sd.nhomes++
	return i
}

// entry returns the entry of b, whose state word is w, in its slab's
// side; nil for a Buffer that has no slab (Owned, borrowed, a view).
func (b *Buffer) entry(w uint64) *entry {
	if sl := b.sl; sl != nil {
		return &sl.side.ents[w>>slotShift&0xff]
	}
	return nil
}

// untrack clears root r's entry, if it has one: r is closed or disowned,
// and the net must not free it. Only r's closer calls it.
func (r *Buffer) untrack() {
	if e := r.entry(r.word.Load()); e != nil {
		e.meta = 0
	}
}

// cursor is a P's (see pin) place in its current slab.
type cursor struct {
	slab atomic.Pointer[slab] // nil: none yet, or dropped by gcHook
	next int                  // the next free slot of slab
	home int                  // the index of the home used last in slab, or -1
	// The resource (its interface words) and stream of that home, to
	// compare with without reading the slab's side. Plain words, so that
	// the cursor keeps nothing alive: they are used only while slab is the
	// slab whose side holds them (and so keeps them alive).
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

// newTracked returns a Buffer from a slab for the memory at ptr of size
// bytes that mr allocated on s, with state word w.
func newTracked(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream, w uint64) *Buffer {
	t, d := words(mr)
	id := pin()
	if c := cursorOf(id); c != nil && c.next < slabSize && c.home >= 0 && c.mrData == d && c.mrType == t && c.stream == uintptr(unsafe.Pointer(s)) {
		if sl := c.slab.Load(); sl != nil {
			i, hi := c.next, c.home
			c.next++
			unpin(id)
			return sl.fill(i, hi, ptr, size, w)
		}
	}
	unpin(id)
	return newTrackedSlow(ptr, size, mr, s, w)
}

// newTrackedSlow is newTracked when the slab is full or missing, or the
// home is not the last one.
func newTrackedSlow(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream, w uint64) *Buffer {
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
		hi := -1
		if sl != nil && c.next < slabSize {
			hi = sl.side.home(mr, s)
		}
		if hi < 0 {
			// Full, missing, or no room for another home: a new slab.
			if fresh == nil {
				// Allocate unpinned, then look again: the goroutine may
				// be on another P by then.
				unpin(id)
				fresh = newSlab()
				continue
			}
			sl, fresh = fresh, nil
			c.slab.Store(sl)
			c.next = 0
			hi = sl.side.home(mr, s)
		}
		i := c.next
		c.next++
		c.home, c.stream = hi, uintptr(unsafe.Pointer(s))
		c.mrType, c.mrData = words(mr)
		unpin(id)
		// fresh, if still set, was not needed: its cleanup finds it
		// empty.
		return sl.fill(i, hi, ptr, size, w)
	}
}

// fill makes slot i of the slab, which the caller took from its cursor,
// the Buffer of the memory at ptr, of home hi, with state word w.
func (sl *slab) fill(i, hi int, ptr cuda.DevicePtr, size uint64, w uint64) *Buffer {
	sd := sl.side
	m := metaOpen | uint64(hi)<<metaShift | size
	if w&viewedBit != 0 {
		m |= metaViewed
	}
	sd.ents[i] = entry{ptr: ptr, meta: m}
	b := &sl.bufs[i]
	b.ptr, b.size, b.sl = ptr, size, sl
	initWord(b, w|uint64(i)<<slotShift|uint64(hi)<<homeShift)
	return b
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

// collectSide frees the allocations of a collected slab that are still
// open, except those a host view may still point at, and counts them. A
// held Buffer is never here: the Hold keeps it reachable.
func collectSide(sd *slabSide) {
	for i := range sd.ents {
		e := &sd.ents[i]
		if e.meta&metaOpen == 0 {
			continue
		}
		leaks.Add(1)
		if e.meta&metaViewed != 0 {
			leaksKept.Add(1)
			continue
		}
		h := &sd.homes[e.meta>>metaShift&metaHome]
		if freeOrFallback(h.mr, e.ptr, e.meta&maxTracked, h.stream) != nil {
			leaksKept.Add(1)
		}
	}
}

// collectOne, the finalizer of the Buffers made by Owned (which have no
// slab), frees the allocation of a collected Buffer that was never
// closed, unless a host view may still point at it.
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
	x := b.x.Load() // Owned made it, with the home
	if freeOrFallback(x.home.mr, b.ptr, b.size, x.home.stream) != nil {
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
