package resource

// SubAllocator: the per-stream caches, the fast path that takes no
// shared lock, and their shards for goroutines sharing one stream.

import (
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// A cache is one stream's private stock of ranges, in front of the shared
// books (the size classes, the blocks, the address index, all under
// SubAllocator.mu): up to 64 ranges per shard and a quarter of GrowSize in
// all. Once its lock is seen contended it widens to a shard per P
// (GOMAXPROCS rounded up to a power of two, at most 64), each with its
// share of the limits; a goroutine uses the shard of its P (a hint from a
// sync.Pool, which is per P). A free on the stream from another P than
// the allocation's takes the shared lock, and the range goes to the
// stream's list.
//
// To the shared books, a range in a shard is live: carved, in the address
// index, counted in used and in its block's live count, marked with the
// cache's id and the shard's index. A shard holds two sets:
//
//   - live: the allocations it handed out and not yet freed, by address,
//     with their sizes, so that a free on the same stream from the same P
//     is checked (unknown address, double free, wrong size) without the
//     shared lock;
//   - free: ranges freed on its stream, reused by allocations of exactly
//     their (aligned) size on that stream, at once.
//
// The shared side flushes caches (the free ranges of every shard go back
// to the books, each on its cache's stream) whenever it needs to see all
// the free memory: before ordering a stream after another or growing (the
// allocating stream's cache first, then all), and in Trim, Close and
// Stats.
//
// Lock order: SubAllocator.mu before a shard's mu; the fast paths take a
// shard's mu alone, and never take the shared lock while holding it.
type subCache struct {
	_    [64]byte
	key  *cuda.Stream
	id   int32
	wide atomic.Pointer[subShards] // nil: one shard, own
	self [1]*subShard              // &own, for all
	_    [64]byte                  // wide is read by every pair, own.mu written: apart
	own  subShard                  // the only shard until contention, then shard 0
}

// subShard is one lock's worth of a cache (see subCache).
type subShard struct {
	_         [64]byte // the fast path writes mu and the sets: a cache line of their own
	mu        sync.Mutex
	dead      bool // dropped by Trim or Close: no fast path; free stays empty
	contended int  // own: the acquisitions that found it held while the cache had one shard
	live      subIndex
	free      []subCached
	bytes     uint64 // bytes in free
	limit     uint64 // the most bytes free may hold
	_         [64]byte
}

// subShards are a widened cache's shards; shards[0] is the cache's own.
type subShards struct {
	shards []*subShard // a power of two long
}

// subCached is a free range in a cache: its address, aligned size and
// chunk.
type subCached struct {
	addr, size uint64
	c          int32
}

const (
	// A shard keeps at most subCacheRanges ranges and its limit in bytes:
	// a quarter of GrowSize (SubAllocator.cacheBytes) for a cache of one
	// shard, split evenly among the shards of a widened one, so that a
	// stream's caches hold as much free memory in either case. A free
	// beyond them goes to the shared books.
	subCacheRanges = 64
	// subMaxShards caps the shards of one cache.
	subMaxShards = 64
	// subWidenAfter is how many acquisitions of a cache's one shard must
	// find it held by another goroutine before the cache widens: a pair
	// of goroutines that meet now and then does not make it pay for
	// shards.
	subWidenAfter = 64
)

// subHint is a P's shard hint: the pool keeps one per P, so a goroutine
// gets the hint of the P it runs on (another one, now and then, when it
// migrates or a collection empties the pool: a hint only spreads the
// load, the shards' sets decide what is valid).
type subHint struct{ n uint32 }

var (
	subHints    = sync.Pool{New: func() any { return &subHint{n: subHintNext.Add(1) - 1} }}
	subHintNext atomic.Uint32
)

// subHintHook, if set (by tests), replaces the running P's hint.
var subHintHook func() uint32

// hint returns the running P's shard hint.
func hint() uint32 {
	if subHintHook != nil {
		return subHintHook()
	}
	h := subHints.Get().(*subHint)
	n := h.n
	subHints.Put(h)
	return n
}

// shardFor returns the shard of c for hint h, and its index.
func (c *subCache) shardFor(h uint32) (*subShard, uint8) {
	w := c.wide.Load()
	if w == nil {
		return &c.own, 0
	}
	k := h & uint32(len(w.shards)-1)
	return w.shards[k], uint8(k)
}

// shard returns the shard of index k (as marked on a chunk).
func (c *subCache) shard(k uint8) *subShard {
	if w := c.wide.Load(); w != nil {
		return w.shards[k]
	}
	return &c.own
}

// all returns c's shards.
func (c *subCache) all() []*subShard {
	if w := c.wide.Load(); w != nil {
		return w.shards
	}
	return c.self[:]
}

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
func (sh *subShard) pop(n uint64) (subCached, bool) {
	for i := len(sh.free) - 1; i >= 0; i-- {
		if e := sh.free[i]; e.size == n {
			last := len(sh.free) - 1
			sh.free[i] = sh.free[last]
			sh.free = sh.free[:last]
			sh.bytes -= n
			return e, true
		}
	}
	return subCached{}, false
}

// lockShard locks and returns the shard of c a fast path uses, and the
// hint that chose it (0 while c has one shard), when c's own shard is
// not simply free to take: the fast paths try that first, inline. A
// cache of one shard counts the acquisitions that found it held: past
// subWidenAfter, it widens.
func (a *SubAllocator) lockShard(c *subCache) (*subShard, uint32) {
	if w := c.wide.Load(); w != nil {
		h := hint()
		sh := w.shards[h&uint32(len(w.shards)-1)]
		sh.mu.Lock()
		return sh, h
	}
	if c.own.mu.TryLock() {
		return &c.own, 0
	}
	return a.lockContended(c)
}

// lockContended is lockShard when the cache's one shard is held.
func (a *SubAllocator) lockContended(c *subCache) (*subShard, uint32) {
	sh := &c.own
	sh.mu.Lock()
	if c.wide.Load() != nil {
		// Widened while this goroutine waited: own is shard 0 now, as
		// good as any other shard for this one operation.
		return sh, 0
	}
	sh.contended++
	if sh.contended%subWidenAfter != 0 {
		return sh, 0
	}
	sh.mu.Unlock()
	a.widen(c)
	return a.lockShard(c)
}

// fastTake serves an allocation of n (aligned, nonzero) bytes on s from
// s's cache, or reports false; h is the shard hint it used, for the slow
// path to record the allocation in the same shard.
func (a *SubAllocator) fastTake(n uint64, s *cuda.Stream) (addr uint64, h uint32, ok bool) {
	c := a.cacheOf(s)
	if c == nil {
		return 0, 0, false
	}
	sh, h := &c.own, uint32(0)
	if c.wide.Load() != nil || !sh.mu.TryLock() {
		sh, h = a.lockShard(c)
	}
	var e subCached
	if !sh.dead {
		if e, ok = sh.pop(n); ok {
			sh.live.put(e.addr, e.c, e.size)
		}
	}
	sh.mu.Unlock()
	return e.addr, h, ok
}

// fastFree frees an allocation on s into s's cache. done reports whether
// it was handled (err is then the outcome: nil, or a size mismatch);
// false sends the free to the shared books.
func (a *SubAllocator) fastFree(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) (done bool, err error) {
	c := a.cacheOf(s)
	if c == nil {
		return false, nil
	}
	sh := &c.own
	if c.wide.Load() != nil || !sh.mu.TryLock() {
		sh, _ = a.lockShard(c)
	}
	// Unlocked without defer, which costs the pair a dozen instructions.
	if !sh.dead {
		// Not in live: not handed out by this shard (another stream's,
		// another shard's, or not live): the shared books decide.
		if ci, have := sh.live.lookup(uint64(ptr)); ci != 0 {
			if n, ok := alignUp(size, a.align); !ok || n != have {
				sh.mu.Unlock()
				return true, a.sizeErr(ptr, size, have)
			}
			// Unless full (cap is subCacheRanges: append never grows
			// it): then the shared books take it.
			if len(sh.free) < cap(sh.free) && sh.bytes+have <= sh.limit && sh.bytes+have >= sh.bytes {
				sh.live.remove(uint64(ptr))
				sh.free = append(sh.free, subCached{addr: uint64(ptr), size: have, c: ci})
				sh.bytes += have
				done = true
			}
		}
	}
	sh.mu.Unlock()
	return done, nil
}

// newShard returns an empty shard holding at most limit bytes.
func newShard(limit uint64) *subShard {
	sh := &subShard{limit: limit}
	sh.init()
	return sh
}

// init gives a shard its free list, whole: its capacity is the most
// ranges it holds.
func (sh *subShard) init() {
	// In an allocation of its own (1.5 KiB): grown by append from empty,
	// the small arrays of different caches would be neighbours in memory,
	// and the fast paths of goroutines on different cores would write the
	// same cache lines.
	sh.free = make([]subCached, 0, subCacheRanges)
}

func (a *SubAllocator) sizeErr(ptr cuda.DevicePtr, size, have uint64) error {
	return cuda.Errorf("SubAllocator.Deallocate", cuda.ErrInvalidArgument, "%#x: %d bytes given, the allocation has %d (aligned to %d)", uint64(ptr), size, have, a.align)
}

// widen gives c a shard per P, once its one shard was found contended
// often enough. It takes the shared lock (no shard lock is held): widening
// happens once in a cache's life, and under the lock it cannot race with
// Trim or Close dropping the cache.
func (a *SubAllocator) widen(c *subCache) {
	n := 1
	for n < runtime.GOMAXPROCS(0) && n < subMaxShards {
		n *= 2
	}
	if n == 1 {
		return // one P: a goroutine preempted in the lock, not contention
	}
	a.mu.Lock()
	a.widenLocked(c, n)
	a.mu.Unlock()
}

// widenLocked gives c n shards (a power of two, at most subMaxShards),
// unless it has several already or is dropped.
func (a *SubAllocator) widenLocked(c *subCache, n int) {
	// own.dead is read under the shared lock: it is written under both.
	if c.wide.Load() != nil || a.closed || a.cacheMap[c.key] != c || c.own.dead {
		return
	}
	w := &subShards{shards: make([]*subShard, n)}
	limit := a.cacheBytes / uint64(n)
	w.shards[0] = &c.own
	for k := 1; k < n; k++ {
		w.shards[k] = newShard(limit)
	}
	// own's ranges go back to the books, so that the shards together
	// never hold more than the cache did.
	c.own.mu.Lock()
	a.flushHeldLocked(c, &c.own)
	c.own.limit = limit
	c.own.mu.Unlock()
	c.wide.Store(w)
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
	c := &subCache{key: s}
	c.self[0], c.own.limit = &c.own, a.cacheBytes
	c.own.init()
	c.id = tableAdd(&a.cacheTab, &a.freeCache, c)
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
			if !c.own.dead {
				cs.put(s, c)
			}
		}
	}
	a.caches.Store(cs)
}

// recordLocked enters a range just carved for an allocation on s into
// the live set of s's cache's shard for hint h (the allocating
// goroutine's), so that its free on s takes the fast path.
func (a *SubAllocator) recordLocked(s *cuda.Stream, i int32, h uint32) {
	c := a.cacheLocked(s)
	if c == nil {
		return
	}
	ch := &a.chunks[i]
	sh, k := c.shardFor(h)
	sh.mu.Lock()
	sh.live.put(ch.addr, i, ch.size)
	sh.mu.Unlock()
	ch.cache, ch.shard = c.id, k
}

// handedOutLocked reports whether the live chunk i is an allocation in
// use, not a free range held by a cache (a second free of it). With take,
// an allocation in use is also taken out of the shard that handed it out.
func (a *SubAllocator) handedOutLocked(i int32, take bool) bool {
	ch := &a.chunks[i]
	if ch.cache == 0 {
		return true
	}
	sh := a.cacheTab[ch.cache].shard(ch.shard)
	sh.mu.Lock()
	ci, _ := sh.live.lookup(ch.addr)
	inUse := ci != 0
	if inUse && take {
		sh.live.remove(ch.addr)
	}
	sh.mu.Unlock()
	if inUse && take {
		ch.cache, ch.shard = 0, 0
	}
	return inUse
}

// flushLocked gives the free ranges of c's shards back to the shared
// books, on c's stream; it returns how many there were.
func (a *SubAllocator) flushLocked(c *subCache) int {
	if c == nil {
		return 0
	}
	n := 0
	for _, sh := range c.all() {
		// Under sh's lock throughout: the fast path appends to sh.free.
		sh.mu.Lock()
		n += a.flushHeldLocked(c, sh)
		sh.mu.Unlock()
	}
	return n
}

// flushHeldLocked gives the free ranges of c's shard sh, whose lock is
// held, back to the shared books.
func (a *SubAllocator) flushHeldLocked(c *subCache, sh *subShard) int {
	n := len(sh.free)
	if n == 0 {
		return 0
	}
	l := a.listFor(c.key)
	for _, e := range sh.free {
		ch := &a.chunks[e.c]
		ch.cache, ch.shard = 0, 0
		a.live.remove(e.addr)
		a.used -= e.size
		a.blockTab[ch.blk].live--
		a.freeLocked(l, e.c)
	}
	clear(sh.free)
	sh.free, sh.bytes = sh.free[:0], 0
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
		// Every shard locked at once (in order; the fast paths hold one
		// at a time), so that the cache is judged empty and made dead in
		// one step: between the flush above and here, a fast-path free
		// and a take on another shard may have moved a range from one
		// set to another.
		shards := c.all()
		live := 0
		for _, sh := range shards {
			sh.mu.Lock()
			live += sh.live.n
		}
		drop := live == 0
		if drop || a.closed {
			for _, sh := range shards {
				sh.dead = true
				// A fast-path free may have put a range in sh since the
				// flush above; none can now that sh is dead. Give it
				// back before the cache is forgotten (and its id
				// reused), or the range would stay marked with a cache
				// that no longer holds it: lost to the books.
				a.flushHeldLocked(c, sh)
			}
		}
		for _, sh := range shards {
			sh.mu.Unlock()
		}
		if drop {
			delete(a.cacheMap, s)
			a.cacheTab[c.id] = nil
			a.freeCache = append(a.freeCache, c.id)
		}
	}
	a.publishLocked()
}
