package resource

// SubAllocator: the per-stream caches, the fast path that takes no
// shared lock.

import (
	"math/bits"
	"sync"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// A cache is one stream's private stock of ranges, in front of the shared
// books (the size classes, the blocks, the address index, all under
// SubAllocator.mu), as RMM's arena keeps per-thread arenas in front of a
// global one. A pair on a stream whose cache has a range of the size asked
// for takes only that cache's lock, so goroutines on different streams do
// not contend (nor share a written cache line) however many there are.
//
// To the shared books, a range in a cache is live: carved, in the address
// index, counted in used and in its block's live count, marked with the
// cache's id. The cache holds two sets:
//
//   - live: the allocations handed out on its stream and not yet freed,
//     by address, with their sizes, so that a free on the same stream is
//     checked (unknown address, double free, wrong size) without the
//     shared lock;
//   - free: ranges freed on its stream, reused by allocations of exactly
//     their (aligned) size on that stream, at once: memory freed on a
//     stream is reused on it, never on another, which is the rule the
//     shared books keep too.
//
// Everything else takes the shared lock: a size the cache has no range
// for, a free on another stream than the cache's (the range goes to the
// shared books on the freeing stream, as before), a free when the cache
// is full. The shared side flushes caches (their free ranges go back to
// the books, each on its cache's stream, where they coalesce) whenever it
// needs to see all the free memory: before ordering a stream after
// another or growing (the allocating stream's cache first, then all),
// and in Trim, Close and Stats. So caching never makes the sub-allocator
// take memory from the upstream while a fitting range is free anywhere,
// and Stats and Trim see exact books.
//
// Lock order: SubAllocator.mu before a cache's mu; the fast paths take a
// cache's mu alone, and never take the shared lock while holding it.
type subCache struct {
	_     [64]byte // the fast path writes mu and the sets: a cache line of their own
	mu    sync.Mutex
	key   *cuda.Stream
	id    int32
	dead  bool // dropped by Trim or Close: no fast path; free stays empty
	live  subIndex
	free  []subCached
	bytes uint64 // bytes in free
	_     [64]byte
}

// subCached is a free range in a cache: its address, aligned size and
// chunk.
type subCached struct {
	addr, size uint64
	c          int32
}

// Cache limits: a cache keeps at most subCacheRanges ranges and
// SubAllocator.cacheBytes bytes (a quarter of GrowSize); a free beyond
// them goes to the shared books.
const subCacheRanges = 64

// subCaches is the published stream → cache mapping, replaced (never
// changed) under SubAllocator.mu, so the fast path reads it without a
// lock: an open-addressing table keyed by the stream pointer (a Go map
// costs several times as much per lookup here, and the fast path looks
// up twice per pair).
type subCaches struct {
	slots []subCacheSlot // a power of two long, at most half full
	shift uint
}

type subCacheSlot struct {
	key *cuda.Stream
	c   *subCache // nil: empty slot
}

func (cs *subCaches) home(s *cuda.Stream) uintptr {
	// Fibonacci hashing of the address (heap objects do not move).
	// In 64 bits on every target (the constant does not fit a 32-bit
	// uintptr); the result is below len(slots).
	return uintptr((uint64(uintptr(unsafe.Pointer(s))) * 0x9e3779b97f4a7c15) >> cs.shift)
}

func (cs *subCaches) get(s *cuda.Stream) *subCache {
	if cs == nil || len(cs.slots) == 0 {
		return nil
	}
	mask := uintptr(len(cs.slots) - 1)
	for i := cs.home(s); ; i = (i + 1) & mask {
		sl := &cs.slots[i]
		if sl.c == nil || sl.key == s {
			return sl.c
		}
	}
}

func (cs *subCaches) put(s *cuda.Stream, c *subCache) {
	mask := uintptr(len(cs.slots) - 1)
	i := cs.home(s)
	for cs.slots[i].c != nil {
		i = (i + 1) & mask
	}
	cs.slots[i] = subCacheSlot{s, c}
}

// cacheOf returns s's cache, or nil (none yet, or no caching).
func (a *SubAllocator) cacheOf(s *cuda.Stream) *subCache {
	return a.caches.Load().get(s)
}

// pop takes a free range of exactly n bytes, most recently freed first.
func (c *subCache) pop(n uint64) (subCached, bool) {
	for i := len(c.free) - 1; i >= 0; i-- {
		if e := c.free[i]; e.size == n {
			last := len(c.free) - 1
			c.free[i] = c.free[last]
			c.free = c.free[:last]
			c.bytes -= n
			return e, true
		}
	}
	return subCached{}, false
}

// fastTake serves an allocation of n (aligned, nonzero) bytes on s from
// s's cache, or reports false.
func (a *SubAllocator) fastTake(n uint64, s *cuda.Stream) (uint64, bool) {
	c := a.cacheOf(s)
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return 0, false
	}
	e, ok := c.pop(n)
	if ok {
		c.live.put(e.addr, e.c, e.size)
	}
	c.mu.Unlock()
	return e.addr, ok
}

// fastFree frees an allocation on s into s's cache. done reports whether
// it was handled (err is then the outcome: nil, or a size mismatch);
// false sends the free to the shared books.
func (a *SubAllocator) fastFree(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) (done bool, err error) {
	c := a.cacheOf(s)
	if c == nil {
		return false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return false, nil
	}
	ci, have := c.live.lookup(uint64(ptr))
	if ci == 0 {
		return false, nil // not handed out on s: another stream's, or not live
	}
	if n, ok := alignUp(size, a.align); !ok || n != have {
		return true, a.sizeErr(ptr, size, have)
	}
	if len(c.free) >= subCacheRanges || c.bytes+have > a.cacheBytes || c.bytes+have < c.bytes {
		return false, nil // full: the shared books take it
	}
	c.live.remove(uint64(ptr))
	c.free = append(c.free, subCached{addr: uint64(ptr), size: have, c: ci})
	c.bytes += have
	return true, nil
}

func (a *SubAllocator) sizeErr(ptr cuda.DevicePtr, size, have uint64) error {
	return cuda.Errorf("SubAllocator.Deallocate", cuda.ErrInvalidArgument, "%#x: %d bytes given, the allocation has %d (aligned to %d)", uint64(ptr), size, have, a.align)
}

// cacheLocked returns s's cache, making and publishing it if needed; nil
// when caching is off.
func (a *SubAllocator) cacheLocked(s *cuda.Stream) *subCache {
	if a.cacheBytes == 0 {
		return nil
	}
	if c := a.cacheMap[s]; c != nil {
		return c
	}
	// The free list gets its whole capacity now, in an allocation of its
	// own (1.5 KiB): grown by append from empty, the small arrays of
	// different streams' caches were neighbours in memory, and the fast
	// paths of goroutines on different cores wrote the same cache lines (a
	// GPU-host profile at 16 goroutines: a third of the time in pop, the
	// cache's append and its unlock).
	c := &subCache{key: s, free: make([]subCached, 0, subCacheRanges)}
	if n := len(a.freeCache); n > 0 {
		c.id, a.freeCache = a.freeCache[n-1], a.freeCache[:n-1]
		a.cacheTab[c.id] = c
	} else {
		c.id = int32(len(a.cacheTab))
		a.cacheTab = append(a.cacheTab, c)
	}
	a.cacheMap[s] = c
	a.publishLocked()
	return c
}

// publishLocked replaces the published mapping with one of the live
// caches (none after Close).
func (a *SubAllocator) publishLocked() {
	cs := &subCaches{}
	if !a.closed && len(a.cacheMap) > 0 {
		size := 4
		for size < 2*len(a.cacheMap) {
			size *= 2
		}
		cs.slots = make([]subCacheSlot, size)
		cs.shift = uint(64 - bits.TrailingZeros(uint(size)))
		for s, c := range a.cacheMap {
			if !c.dead {
				cs.put(s, c)
			}
		}
	}
	a.caches.Store(cs)
}

// recordLocked enters a range just carved for an allocation on s into
// s's cache's live set, so that its free on s takes the fast path.
func (a *SubAllocator) recordLocked(s *cuda.Stream, i int32) {
	c := a.cacheLocked(s)
	if c == nil {
		return
	}
	ch := &a.chunks[i]
	c.mu.Lock()
	c.live.put(ch.addr, i, ch.size)
	c.mu.Unlock()
	ch.cache = c.id
}

// unrecordLocked takes the live chunk i out of the cache that handed it
// out, if any. It reports false when that cache holds the chunk as free:
// the allocation was already freed, and this is a second free.
func (a *SubAllocator) unrecordLocked(i int32) bool {
	ch := &a.chunks[i]
	if ch.cache == 0 {
		return true
	}
	c := a.cacheTab[ch.cache]
	c.mu.Lock()
	ci, _ := c.live.lookup(ch.addr)
	if ci == 0 {
		c.mu.Unlock()
		return false
	}
	c.live.remove(ch.addr)
	c.mu.Unlock()
	ch.cache = 0
	return true
}

// handedOutLocked reports whether the live chunk i is an allocation in
// use, not a free range held by a cache.
func (a *SubAllocator) handedOutLocked(i int32) bool {
	ch := &a.chunks[i]
	if ch.cache == 0 {
		return true
	}
	c := a.cacheTab[ch.cache]
	c.mu.Lock()
	ci, _ := c.live.lookup(ch.addr)
	c.mu.Unlock()
	return ci != 0
}

// flushLocked gives c's free ranges back to the shared books, on c's
// stream; it returns how many there were.
func (a *SubAllocator) flushLocked(c *subCache) int {
	if c == nil {
		return 0
	}
	// Under c's lock throughout: the fast path appends to c.free.
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.free)
	if n == 0 {
		return 0
	}
	l := a.listFor(c.key)
	for _, e := range c.free {
		ch := &a.chunks[e.c]
		ch.cache = 0
		a.live.remove(e.addr)
		a.used -= e.size
		a.blockTab[ch.blk].live--
		a.freeLocked(l, e.c)
	}
	clear(c.free)
	c.free, c.bytes = c.free[:0], 0
	return n
}

// flushAllLocked flushes every cache; it returns how many ranges came
// back.
func (a *SubAllocator) flushAllLocked() int {
	n := 0
	for _, c := range a.cacheTab {
		n += a.flushLocked(c)
	}
	return n
}

// dropCachesLocked flushes every cache and forgets those with nothing
// live (Trim), or, after Close, marks every cache dead: no fast path any
// more, but the live sets stay, for the frees still to come.
func (a *SubAllocator) dropCachesLocked() {
	a.flushAllLocked()
	for s, c := range a.cacheMap {
		c.mu.Lock()
		drop := c.live.n == 0
		if drop || a.closed {
			c.dead = true
		}
		c.mu.Unlock()
		if c.dead {
			// A fast-path free may have put a range in c since the flush
			// above; none can now that c is dead. Give it back before c
			// is forgotten (and its id reused), or the range would stay
			// marked with a cache that no longer holds it: lost to the
			// books (found by TestSubAllocatorConcurrent under -race on
			// the GPU host).
			a.flushLocked(c)
		}
		if drop {
			delete(a.cacheMap, s)
			a.cacheTab[c.id] = nil
			a.freeCache = append(a.freeCache, c.id)
		}
	}
	a.publishLocked()
}
