package buffer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/warn"
)

// The garbage-collection safety net. A runtime.AddCleanup per Buffer
// costs about as much as the driver's allocate+free pair, so owned Buffers
// are carved out of 16 KiB slabs with one finalizer each: once no Buffer
// of a slab is reachable, it frees every allocation whose Buffer was never
// closed and counts it in Leaks. A closed Buffer reaches nothing (its home
// is nil), since a slab reachable from itself is never finalized; a leaked
// Buffer whose resource holds Buffers of the same slab is neither freed
// nor counted while that resource lives.
//
// A []byte from Buffer.Bytes does not keep the Buffer alive, so a viewed
// allocation (viewedBit) is counted but never freed by the net; the mark
// follows the memory through Disown to the next Owned buffer at the same
// address (disownedViews).

// leaks counts buffers garbage collected without Close; leaksKept counts
// those among them whose memory the safety net did not free.
var leaks, leaksKept atomic.Int64

// Leaks returns how many owned buffers were garbage collected without
// Close. The safety net frees their memory, except for those counted by
// [LeaksKept]. Tests assert it stays 0. The net watches buffers made
// together as a group, so a lost buffer is found only once every buffer
// of its group is unreachable: possibly long after it was lost.
func Leaks() int64 { return leaks.Load() }

// LeaksKept returns how many of the buffers counted by [Leaks] kept their
// memory instead, for the life of the process: the net never frees memory
// under a host view ([Buffer.Bytes]) that was handed out, and gives up
// when the resource refuses to free (on the allocation stream and on the
// default one). A free whose error wraps [ErrPartlyFreed] gave the memory
// back, and is not counted here.
func LeaksKept() int64 { return leaksKept.Load() }

// slabSize fills the slabBytes size class: a slab has pointers and is
// over 512 bytes, so the allocator puts an 8-byte type header before it.
const slabSize = (slabBytes - 8) / int(unsafe.Sizeof(Buffer{}))

const slabBytes = 16 << 10

type slab [slabSize]Buffer

// cursor hands out the next Buffer of a slab, and the homes of the last
// few (resource, stream) pairs it served: one cursor per P (shards under
// the race detector), so that making a Buffer takes no lock and no atomic
// read-modify-write. Its owner (pinned) reads and writes it; dropSlabs
// sets its pointers to nil from any goroutine, and an owner that raced
// with it uses the old slab or home once more, which is harmless.
type cursor struct {
	slab  atomic.Pointer[slab]
	next  int
	homes [4]atomic.Pointer[home] // a few, for goroutines that alternate streams or resources
	evict int                     // the slot of homes the next new home takes
	// Padded to two cache lines, so that two Ps' cursors never share one
	// (their owners write them on every Allocate).
	_ [128 - 5*unsafe.Sizeof(atomic.Pointer[slab]{}) - 2*unsafe.Sizeof(0)]byte
}

// carve returns a Buffer from the calling P's slab, homed at (mr, free, s).
func carve(mr, free MemoryResource, s *cuda.Stream) *Buffer {
	c := pin()
	if c != nil && c.next < slabSize {
		if sl, h := c.slab.Load(), c.home(mr, free, s); sl != nil && h != nil {
			b := &sl[c.next]
			c.next++
			b.home = h
			unpin(c)
			return b
		}
	}
	unpin(c)
	return carveSlow(mr, free, s)
}

// carveSlow makes the slab or home the P lacks, unpinned (allocation may
// block), then pins again to install it, maybe on another P, whose slab it
// replaces (unused slots stay zero; collectSlab skips them).
func carveSlow(mr, free MemoryResource, s *cuda.Stream) *Buffer {
	var sl *slab
	var h *home
	for {
		c := pin()
		if c == nil {
			unpin(c)
			growCursors()
			continue
		}
		if sl != nil {
			c.slab.Store(sl)
			c.next, sl = 0, nil
		}
		if h != nil {
			c.homes[c.evict].Store(h)
			c.evict, h = (c.evict+1)%len(c.homes), nil
		}
		cur, ch := c.slab.Load(), c.home(mr, free, s)
		full := cur == nil || c.next >= slabSize
		if !full && ch != nil {
			b := &cur[c.next]
			c.next++
			b.home = ch
			unpin(c)
			return b
		}
		unpin(c)
		if full {
			sl = new(slab)
			runtime.SetFinalizer(sl, collectSlab)
		}
		if ch == nil {
			h = &home{mr: mr, free: free, stream: s}
		}
	}
}

// home returns the cursor's home of (mr, free, s), or nil.
func (c *cursor) home(mr, free MemoryResource, s *cuda.Stream) *home {
	for i := range c.homes {
		if h := c.homes[i].Load(); h != nil && h.stream == s && sameResource(h.mr, mr) && sameResource(h.free, free) {
			return h
		}
	}
	return nil
}

// sameResource compares two resources word by word: equal words are the
// same resource, and unequal ones of the pointer-shaped resources every
// package here has are different resources. A resource of another shape
// may compare unequal to itself, which only costs a new home; == would
// instead panic on one that is not comparable.
func sameResource(a, b MemoryResource) bool {
	return *(*[2]uintptr)(unsafe.Pointer(&a)) == *(*[2]uintptr)(unsafe.Pointer(&b))
}

// dropSlabs makes every cursor start a new slab and forget its homes, so
// that an idle P keeps no slab (hiding its leaks) or resource reachable for
// good, as sync.Pool gives up its objects.
func dropSlabs() {
	eachCursor(func(c *cursor) {
		c.slab.Store(nil)
		for i := range c.homes {
			c.homes[i].Store(nil)
		}
	})
}

// armGCHook drops the cursors' slabs after each collection, through a
// finalizer that re-arms itself (the pointer field keeps the object out of
// the tiny allocator, whose objects share finalizers).
func armGCHook() {
	runtime.SetFinalizer(&struct{ _ *byte }{}, func(any) {
		dropSlabs()
		armGCHook()
	})
}

func init() { armGCHook() }

// collectSlab frees the allocations of a collected slab whose Buffers were
// never closed, except those a host view may still point at. Slots never
// handed out are zero (no ownedBit), and empty Buffers have nothing to
// free. A held Buffer is never here: the Hold keeps it reachable.
func collectSlab(s *slab) {
	for i := range s {
		b := &s[i]
		w := b.word.Load()
		if w&ownedBit == 0 || w&closedBit != 0 || b.ptr == 0 {
			continue
		}
		b.word.Store(w | closedBit)
		leaks.Add(1)
		if w&viewedBit != 0 {
			leaksKept.Add(1)
			continue
		}
		if err := netFree(b.home, b.ptr, b.size); err != nil {
			warn.Failed("Buffer safety net: Deallocate", err, "addr", fmt.Sprintf("%#x", uint64(b.ptr)), "size", b.size)
			if !errors.Is(err, ErrPartlyFreed) {
				leaksKept.Add(1)
			}
		}
	}
}

var errFreePanicked = errors.New("the resource's Deallocate panicked")

// netFree frees a leaked buffer on the finalizer goroutine, where a panic
// would end the program: a Deallocate that panics keeps its memory
// (counted in LeaksKept), and the net goes on.
func netFree(h *home, p cuda.DevicePtr, n uint64) (err error) {
	defer func() {
		if recover() != nil {
			err = errFreePanicked
		}
	}()
	return freeOrFallback(h.free, p, n, h.stream)
}

// freeOrFallback frees on s, or, only if s is closed by now, on the
// resource's default stream (nil). A free refused for any other reason (s
// capturing, say) must not become a free on the legacy stream, unordered
// after the work on s; nor one that freed part of the memory
// (ErrPartlyFreed) a second free. When the fallback fails too, the error
// wraps both, so that it matches ErrPartlyFreed if the fallback got that
// far.
func freeOrFallback(mr MemoryResource, p cuda.DevicePtr, n uint64, s *cuda.Stream) error {
	err := mr.Deallocate(p, n, s)
	if err != nil && s != nil && errors.Is(err, cuda.ErrClosed) && !errors.Is(err, ErrPartlyFreed) {
		ferr := mr.Deallocate(p, n, nil)
		if ferr == nil {
			return nil
		}
		return fmt.Errorf("%w; then on the default stream: %w", err, ferr)
	}
	return err
}

// disownedViews holds the addresses of viewed allocations that were
// disowned: the next Owned buffer at such an address inherits the mark
// (n lets Owned pay one load while there are none). A stale entry only
// keeps the net from freeing the next allocation there if it leaks.
var disownedViews viewMarks

type viewMarks struct {
	m sync.Map // cuda.DevicePtr -> struct{}
	n atomic.Int64
}

func (v *viewMarks) add(ptr cuda.DevicePtr) {
	if _, loaded := v.m.LoadOrStore(ptr, struct{}{}); !loaded {
		v.n.Add(1)
	}
}

// take returns viewedBit if a disowned viewed allocation left its mark at
// ptr (and takes the mark), else 0.
func (v *viewMarks) take(ptr cuda.DevicePtr) uint64 {
	if _, ok := v.m.LoadAndDelete(ptr); ok {
		v.n.Add(-1)
		return viewedBit
	}
	return 0
}
