package resource

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// SubAllocatorOptions configure NewSubAllocator. Nil options, or the zero
// value, give no initial reserve, 64 MiB growth steps, no cap and 256-byte
// alignment.
type SubAllocatorOptions struct {
	// InitialSize is taken from the upstream by NewSubAllocator (on the
	// upstream's default stream), so that the first allocations need no
	// upstream call. 0 takes nothing until the first Allocate.
	InitialSize uint64
	// GrowSize is the least the sub-allocator takes from the upstream when
	// no free range fits a request; 0 means 64 MiB. A request larger than
	// GrowSize gets a block of its own size rather than twice that, so a
	// single large allocation does not hold memory nothing else may want;
	// Trim gives such a block back once it is free.
	GrowSize uint64
	// MaxSize caps the bytes held from the upstream; 0 means no cap.
	// Beyond it Allocate fails with an error matching
	// cuda.ErrorOutOfMemory, and the sub-allocator keeps working for
	// requests that fit.
	MaxSize uint64
	// Alignment of every allocation's address and size, a power of two; 0
	// means 256 bytes, what cudaMalloc guarantees and what RMM uses.
	Alignment uint64
}

const (
	subDefaultGrow  = 64 << 20
	subDefaultAlign = 256
	// subUpstreamAlign is the alignment upstreams are assumed to give (the
	// driver's guarantee for device and pinned memory); larger alignments
	// ask the upstream for the difference more, to align the block's start.
	subUpstreamAlign = 256
)

// SubAllocator is a memory resource that carves allocations out of large
// blocks it takes from another resource (the upstream): RMM's
// pool_memory_resource, over any upstream (a DevicePool, pinned or managed
// memory, an adaptor). It exists because a pair through a driver pool
// costs a driver call each way, a few hundred nanoseconds at best, while
// carving a range out of memory already held is a few dozen nanoseconds
// of Go. Allocate and Deallocate on one stream never call the driver once
// the sub-allocator holds enough memory; the pair, Buffer included, stays
// well under 0.2 µs (see BenchmarkSubAllocatorPair).
//
// # Streams
//
// The sub-allocator keeps RMM's stream-ordered contract. Free ranges
// belong to the stream they were freed on (the stream given to
// Deallocate, or the buffer's allocation stream on Close; nil, the
// upstream's default stream, is a stream of its own). Memory freed on S
// may still be in use by work already queued on S, so it is handed out
// again at once only to allocations on S, where that work comes first.
// When S has no free range that fits, a range freed on another stream T is
// taken only after ordering S after T: an event (one per stream, made when
// first needed and reused) is recorded on T and S waits for it, so the
// host does not block (unless T was destroyed: then T's device is
// synchronized); every free range of T then moves to S. Only when no
// stream has a fitting range does the sub-allocator take a new block from
// the upstream, ordered on S. Free ranges coalesce with their neighbours
// in the same upstream block when they belong to the same stream.
//
// Fitting is a good fit, as in TLSF: free ranges are kept in size classes
// a sixteenth of a power of two wide; a request takes the first range of
// its own class that fits (at most a sixteenth too large), else any range
// of the next non-empty class, and the remainder stays free. Every step
// is O(1) whatever the number of free ranges, apart from scanning the
// request's own class.
//
// # Lifetimes
//
// Trim gives back the upstream blocks that are entirely free. Close gives
// back every block and makes later Allocate and Trim calls fail with
// cuda.ErrClosed; if allocations are still live it says how many, and
// each block is given back when its last allocation is deallocated
// (Deallocate keeps working after Close). Destroying a stream that was
// given to Deallocate while the sub-allocator holds memory freed on it is
// allowed (its work finishes first; see Trim), but the sub-allocator keeps
// a reference to each stream it has seen until Trim finds nothing free on
// it, so programs that make many short-lived streams should Trim now and
// then.
//
// A SubAllocator is safe for concurrent use: one mutex guards it, held
// for the Go bookkeeping and, on the slow paths only, for the driver
// calls that order streams and the upstream calls that grow it.
type SubAllocator struct {
	up               buffer.MemoryResource
	align, grow, max uint64
	order            subOrderer

	mu      sync.Mutex
	closed  bool
	lists   map[*cuda.Stream]*subList
	streams []*subList  // the lists in creation order, for deterministic stealing
	last    *subList    // the list used last: the common one-stream case skips the map
	live    subIndex    // live chunks by address
	blocks  []*subBlock // sorted by base address
	used    uint64      // bytes of live allocations (aligned sizes)
	held    uint64      // bytes held from the upstream

	deferred  error // failures of releases Deallocate ran after Close, for the next Close
	orderDone bool  // order.close succeeded; until then every Close retries it

	// The chunks live in one slice and refer to each other, to their
	// block and to their list by index, so that the structure holds no
	// pointers: the garbage collector never walks it, however many chunks
	// there are, and its updates need no write barriers while a
	// collection runs (often, since every Buffer is an allocation).
	// Index 0 of each table means none.
	chunks   []subChunk
	spare    []int32     // recycled chunk indexes, so steady state allocates nothing
	blockTab []*subBlock // by block id
	freeBlk  []int32     // unused block ids
	listTab  []*subList  // by list id
	freeList []int32     // unused list ids
}

var _ buffer.MemoryResource = (*SubAllocator)(nil)

// SubAllocatorStats is a snapshot of a SubAllocator's books.
type SubAllocatorStats struct {
	// Reserved is the bytes held from the upstream (blocks being given back
	// by a Trim in progress included).
	Reserved uint64
	// Used is the bytes of live allocations, each rounded up to the
	// alignment.
	Used uint64
	// Free is the bytes in free ranges, available to later allocations.
	// Reserved - Used - Free is what aligning the blocks' ends cost, plus
	// the blocks being given back.
	Free uint64
	// Blocks is the number of upstream blocks held.
	Blocks int
	// Allocations is the number of live allocations (size 0 ones, which
	// take no memory, are not counted).
	Allocations int
	// FreeRanges is the number of free ranges: one per block when every
	// free was on one stream and nothing is live; more means
	// fragmentation.
	FreeRanges int
}

// subChunk is a range of an upstream block: live, or free on one stream's
// list. The chunks of a block form an address-ordered doubly linked list
// (prev, next), which makes coalescing O(1).
type subChunk struct {
	addr, size   uint64
	prev, next   int32 // address neighbours in the same block
	fprev, fnext int32 // links in the size class of the list holding the chunk
	blk          int32 // the block's id
	list         int32 // the id of the stream list holding the chunk while free; 0 while live
	row, col     uint8 // the size class while free
}

// subBlock is one allocation from the upstream.
type subBlock struct {
	buf       *buffer.Buffer // the upstream's buffer: freed by Trim or Close, by the safety net if the sub-allocator leaks
	base      uint64         // the buffer's address
	size      uint64         // the buffer's size (what Reserved counts)
	id        int32
	first     int32 // the chunk at the lowest address
	live      int   // live allocations in the block
	releasing bool  // detached from the lists while Trim or Close gives it back
}

// Size classes (a two-level segregated fit): row 0 holds sizes below 16
// one per column; row r ≥ 1 holds [2^(r+3), 2^(r+4)) in 16 columns of
// equal width. Bitmaps find the next non-empty class in two instructions.
const (
	subCols = 16
	subRows = 61 // sizes up to 2^64-1: bits.Len64 64 → row 60
)

// subList is one stream's free ranges, by size class.
type subList struct {
	key    *cuda.Stream
	id     int32
	n      int    // free ranges in the list
	bytes  uint64 // free bytes in the list
	rowMap uint64
	colMap [subRows]uint16
	heads  [subRows][subCols]int32
}

// subClass returns the size class of size.
func subClass(size uint64) (row, col int) {
	if size < subCols {
		return 0, int(size)
	}
	fl := bits.Len64(size) - 1 // ≥ 4
	return fl - 3, int(size>>(fl-4)) & (subCols - 1)
}

// link puts chunk i (its size set) into its size class of l.
func (a *SubAllocator) link(l *subList, i int32) {
	c := &a.chunks[i]
	r, k := subClass(c.size)
	c.row, c.col = uint8(r), uint8(k)
	h := l.heads[r][k]
	c.fprev, c.fnext = 0, h
	if h != 0 {
		a.chunks[h].fprev = i
	}
	l.heads[r][k] = i
	l.colMap[r] |= 1 << k
	l.rowMap |= 1 << r
}

// unlink takes chunk i out of its size class of l.
func (a *SubAllocator) unlink(l *subList, i int32) {
	c := &a.chunks[i]
	r, k := int(c.row), int(c.col)
	if c.fprev != 0 {
		a.chunks[c.fprev].fnext = c.fnext
	} else {
		l.heads[r][k] = c.fnext
		if c.fnext == 0 {
			l.colMap[r] &^= 1 << k
			if l.colMap[r] == 0 {
				l.rowMap &^= 1 << r
			}
		}
	}
	if c.fnext != 0 {
		a.chunks[c.fnext].fprev = c.fprev
	}
	c.fprev, c.fnext = 0, 0
}

// resize changes the size of chunk i, free on l, moving it to its new
// class if that changed (for large ranges, carving a small piece rarely
// does).
func (a *SubAllocator) resize(l *subList, i int32, size uint64) {
	c := &a.chunks[i]
	r, k := subClass(size)
	if r == int(c.row) && k == int(c.col) {
		c.size = size
		return
	}
	a.unlink(l, i)
	c.size = size
	a.link(l, i)
}

// find returns a free chunk of l of at least n bytes, or 0: the first fit
// in n's own class, else the head of the next non-empty class (all of
// whose ranges fit).
func (a *SubAllocator) find(l *subList, n uint64) int32 {
	if l.rowMap == 0 {
		return 0
	}
	r, k := subClass(n)
	for i := l.heads[r][k]; i != 0; i = a.chunks[i].fnext {
		if a.chunks[i].size >= n {
			return i
		}
	}
	if m := l.colMap[r] & (^uint16(0) << (k + 1)); m != 0 {
		return l.heads[r][bits.TrailingZeros16(m)]
	}
	rm := l.rowMap & (^uint64(0) << (r + 1))
	if rm == 0 {
		return 0
	}
	r = bits.TrailingZeros64(rm)
	return l.heads[r][bits.TrailingZeros16(l.colMap[r])]
}

// any returns some free chunk of l, or 0.
func (l *subList) any() int32 {
	if l.rowMap == 0 {
		return 0
	}
	r := bits.TrailingZeros64(l.rowMap)
	return l.heads[r][bits.TrailingZeros16(l.colMap[r])]
}

// NewSubAllocator returns a sub-allocator over upstream, which it uses
// but does not own (closing the upstream is left to its owner, after the
// sub-allocator's Close). With opts.InitialSize set it takes that much
// from the upstream now, on the upstream's default stream.
//
// Bad options (an alignment that is not a power of two, an initial size
// above MaxSize) and a nil upstream are errors matching
// cuda.ErrInvalidArgument; the upstream's error is returned wrapped if
// the initial block cannot be had.
func NewSubAllocator(upstream buffer.MemoryResource, opts *SubAllocatorOptions) (*SubAllocator, error) {
	const op = "NewSubAllocator"
	if upstream == nil || isNilPointer(upstream) {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil upstream resource")
	}
	var o SubAllocatorOptions
	if opts != nil {
		o = *opts
	}
	if o.Alignment == 0 {
		o.Alignment = subDefaultAlign
	}
	if o.Alignment&(o.Alignment-1) != 0 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "Alignment %d is not a power of two", o.Alignment)
	}
	if o.GrowSize == 0 {
		o.GrowSize = subDefaultGrow
	}
	grow, ok := alignUp(o.GrowSize, o.Alignment)
	if !ok {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "GrowSize %d overflows when aligned to %d bytes", o.GrowSize, o.Alignment)
	}
	if o.MaxSize != 0 && o.InitialSize > o.MaxSize {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "InitialSize %d exceeds MaxSize %d", o.InitialSize, o.MaxSize)
	}
	a := &SubAllocator{
		up:    upstream,
		align: o.Alignment,
		grow:  grow,
		max:   o.MaxSize,
		order: newEventOrder(upstream.DeviceID()),
		lists: make(map[*cuda.Stream]*subList),
		// Index 0 of each table is the "none" entry.
		chunks:   make([]subChunk, 1, 64),
		blockTab: []*subBlock{nil},
		listTab:  []*subList{nil},
	}
	if o.InitialSize > 0 {
		n, ok := alignUp(o.InitialSize, o.Alignment)
		if !ok {
			return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "InitialSize %d overflows when aligned to %d bytes", o.InitialSize, o.Alignment)
		}
		a.mu.Lock()
		err := a.growLocked(op, a.listFor(nil), n, n, nil)
		a.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// alignUp rounds n up to a multiple of the power of two align; ok is false
// on overflow.
func alignUp(n, align uint64) (uint64, bool) {
	m := (n + align - 1) &^ (align - 1)
	return m, m >= n
}

func (a *SubAllocator) check(op string) error {
	if a == nil || a.up == nil {
		return cuda.Errorf("SubAllocator."+op, cuda.ErrInvalidArgument, "SubAllocator is not initialized (create it with NewSubAllocator)")
	}
	return nil
}

// Allocate returns a buffer of size bytes usable on s at once (nil: the
// upstream's default stream), carved out of memory the sub-allocator
// holds; closing the buffer gives the range back on s unless CloseOn
// names another stream. It calls no driver function when s has a free
// range that fits; see the type's documentation for what happens when it
// has not. Size 0 returns an empty buffer.
//
// A request beyond MaxSize, or one the upstream cannot grow for, fails
// with an error matching cuda.ErrorOutOfMemory that names the sizes; a
// size that overflows when aligned matches cuda.ErrInvalidArgument; after
// Close the error matches cuda.ErrClosed.
func (a *SubAllocator) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	if err := a.check("Allocate"); err != nil {
		return nil, err
	}
	ptr, err := a.take(size, s)
	if err != nil {
		return nil, err
	}
	return buffer.Owned(ptr, size, a, s), nil
}

// AllocatePtr is Allocate without the Buffer ([buffer.RawResource]): the
// address of a new range of size bytes usable on s (0 for size 0), and s.
// Free it with Deallocate. Adaptors over a SubAllocator use it, so that
// the stack builds one Buffer per allocation.
func (a *SubAllocator) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if err := a.check("AllocatePtr"); err != nil {
		return 0, nil, err
	}
	ptr, err := a.take(size, s)
	if err != nil {
		return 0, nil, err
	}
	return ptr, s, nil
}

// take is Allocate without the Buffer: it returns the address of a new
// range of size bytes on s (0 for size 0).
func (a *SubAllocator) take(size uint64, s *cuda.Stream) (cuda.DevicePtr, error) {
	const op = "SubAllocator.Allocate"
	n, ok := alignUp(size, a.align)
	if !ok {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "%d bytes overflow when aligned to %d bytes", size, a.align)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return 0, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if size == 0 {
		a.mu.Unlock()
		return 0, nil
	}
	l := a.listFor(s)
	i := a.find(l, n)
	if i == 0 {
		var err error
		if i, err = a.slowLocked(l, n, s); err != nil {
			a.mu.Unlock()
			return 0, err
		}
	}
	i = a.carveLocked(l, i, n)
	c := &a.chunks[i]
	addr := c.addr
	a.live.put(addr, i)
	a.used += n
	a.blockTab[c.blk].live++
	a.mu.Unlock()
	return cuda.DevicePtr(addr), nil
}

// listFor returns s's free list, making it if needed.
func (a *SubAllocator) listFor(s *cuda.Stream) *subList {
	if l := a.last; l != nil && l.key == s {
		return l
	}
	l := a.lists[s]
	if l == nil {
		l = &subList{key: s}
		if n := len(a.freeList); n > 0 {
			l.id, a.freeList = a.freeList[n-1], a.freeList[:n-1]
			a.listTab[l.id] = l
		} else {
			l.id = int32(len(a.listTab))
			a.listTab = append(a.listTab, l)
		}
		a.lists[s] = l
		a.streams = append(a.streams, l)
	}
	a.last = l
	return l
}

// slowLocked finds room for n bytes on l (stream s) when l has none: by
// taking another stream's free ranges once s is ordered after it, else by
// growing, else (out of memory) by taking every stream's free ranges in
// case together they coalesce into a fit.
func (a *SubAllocator) slowLocked(l *subList, n uint64, s *cuda.Stream) (int32, error) {
	const op = "SubAllocator.Allocate"
	for _, t := range a.streams {
		if t == l || t.n == 0 || a.find(t, n) == 0 {
			continue
		}
		if err := a.takeLocked(l, t); err != nil {
			return 0, &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes on %s: %w", n, streamName(s), err)}
		}
		return a.find(l, n), nil
	}
	err := a.growLocked(op, l, n, max(a.grow, n), s)
	if err == nil {
		return a.find(l, n), nil
	}
	if !errors.Is(err, cuda.ErrorOutOfMemory) {
		return 0, err
	}
	took := false
	for _, t := range a.streams {
		if t == l || t.n == 0 {
			continue
		}
		if terr := a.takeLocked(l, t); terr != nil {
			return 0, errors.Join(err, terr)
		}
		took = true
	}
	if took {
		if i := a.find(l, n); i != 0 {
			return i, nil
		}
	}
	return 0, err
}

// takeLocked moves every free range of t to l, after making l's stream
// wait for the work queued on t's.
func (a *SubAllocator) takeLocked(l, t *subList) error {
	if err := a.order.waitFor(l.key, t.key); err != nil {
		return fmt.Errorf("order after %s: %w", streamName(t.key), err)
	}
	for i := t.any(); i != 0; i = t.any() {
		a.unlink(t, i)
		t.n--
		t.bytes -= a.chunks[i].size
		a.chunks[i].list = 0
		a.freeLocked(l, i)
	}
	return nil
}

// growLocked takes a block of want bytes (at least n) from the upstream on
// s and adds it to l. Within MaxSize, want shrinks to what is left; if the
// upstream refuses want it is asked for n alone.
func (a *SubAllocator) growLocked(op string, l *subList, n, want uint64, s *cuda.Stream) error {
	extra := uint64(0)
	if a.align > subUpstreamAlign {
		extra = a.align - subUpstreamAlign
	}
	// n and want are multiples of the alignment, and extra is less than
	// it, so the sums below cannot overflow.
	want = max(want, n)
	if a.max != 0 {
		left := a.max - min(a.max, a.held)
		if n+extra > left {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes on %s: a new block of %d bytes would exceed MaxSize %d (%d reserved, %d of it free in ranges too small or fragmented): %w",
				n, streamName(s), n+extra, a.max, a.held, a.freeBytesLocked(), cuda.ErrorOutOfMemory)}
		}
		want = min(want, left-extra)
	}
	var err error
	for _, size := range []uint64{want + extra, n + extra} {
		var ub *buffer.Buffer
		ub, err = a.up.Allocate(size, s)
		if err == nil {
			return a.addBlockLocked(op, l, ub, size, n)
		}
		if size == n+extra || !errors.Is(err, cuda.ErrorOutOfMemory) {
			break
		}
	}
	return &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes on %s: grow from %v: %w", n, streamName(s), a.up, err)}
}

// addBlockLocked adds the upstream buffer ub (of size bytes, asked for to
// hold n) as a block whose aligned range is free on l.
func (a *SubAllocator) addBlockLocked(op string, l *subList, ub *buffer.Buffer, size, n uint64) error {
	base, got := uint64(ub.Ptr()), ub.Size()
	if got != size || base == 0 {
		return a.rejectBlock(op, ub, fmt.Errorf("upstream %v returned %#x (%d bytes) for a request of %d bytes", a.up, base, got, size))
	}
	// A hostile or broken upstream may return a range that wraps past
	// 2^64: it is refused, never carved.
	if base+size < base {
		return a.rejectBlock(op, ub, fmt.Errorf("upstream %v returned %#x (%d bytes), a range that wraps past the end of the address space", a.up, base, size))
	}
	start, ok := alignUp(base, a.align)
	end := (base + size) &^ (a.align - 1)
	if !ok || start >= end || end-start < n {
		return a.rejectBlock(op, ub, fmt.Errorf("upstream %v returned %#x (%d bytes), which cannot hold %d bytes aligned to %d", a.up, base, size, n, a.align))
	}
	b := &subBlock{buf: ub, base: base, size: size}
	if k := len(a.freeBlk); k > 0 {
		b.id, a.freeBlk = a.freeBlk[k-1], a.freeBlk[:k-1]
		a.blockTab[b.id] = b
	} else {
		b.id = int32(len(a.blockTab))
		a.blockTab = append(a.blockTab, b)
	}
	i := a.newChunk()
	c := &a.chunks[i]
	c.addr, c.size, c.blk = start, end-start, b.id
	b.first = i
	at, _ := slices.BinarySearchFunc(a.blocks, base, func(x *subBlock, v uint64) int {
		switch {
		case x.base < v:
			return -1
		case x.base > v:
			return 1
		}
		return 0
	})
	a.blocks = slices.Insert(a.blocks, at, b)
	a.held += size
	a.freeLocked(l, i)
	return nil
}

// rejectBlock gives back an upstream buffer that cannot serve as a block
// and returns the reason, matching cuda.ErrInvalidArgument, joined with
// the error of giving it back if that failed.
func (a *SubAllocator) rejectBlock(op string, ub *buffer.Buffer, why error) error {
	err := &cuda.OpError{Op: op, Err: fmt.Errorf("%w: %w", cuda.ErrInvalidArgument, why)}
	if cerr := ub.Close(); cerr != nil {
		return errors.Join(err, fmt.Errorf("give the buffer back: %w", cerr))
	}
	return err
}

// carveLocked takes n bytes from chunk i, free on l, and returns the
// live chunk: i itself when it fits exactly, else a new chunk cut from its
// end, so that i keeps its place (and usually its size class).
func (a *SubAllocator) carveLocked(l *subList, i int32, n uint64) int32 {
	l.bytes -= n
	if a.chunks[i].size == n {
		a.unlink(l, i)
		l.n--
		a.chunks[i].list = 0
		return i
	}
	u := a.newChunk() // may move a.chunks: take pointers after
	c, uc := &a.chunks[i], &a.chunks[u]
	uc.addr, uc.size, uc.blk = c.addr+c.size-n, n, c.blk
	uc.prev, uc.next = i, c.next
	if c.next != 0 {
		a.chunks[c.next].prev = u
	}
	c.next = u
	a.resize(l, i, c.size-n)
	return u
}

// freeLocked puts chunk i (live, or taken from another list) on l,
// merging it with its address neighbours that are free on l.
func (a *SubAllocator) freeLocked(l *subList, i int32) {
	c := &a.chunks[i]
	l.bytes += c.size
	p, nx := c.prev, c.next
	switch {
	case p != 0 && a.chunks[p].list == l.id:
		pc := &a.chunks[p]
		size := pc.size + c.size
		pc.next = nx
		if nx != 0 {
			a.chunks[nx].prev = p
		}
		a.recycle(i)
		if nx != 0 && a.chunks[nx].list == l.id {
			nc := &a.chunks[nx]
			a.unlink(l, nx)
			l.n--
			size += nc.size
			pc.next = nc.next
			if nc.next != 0 {
				a.chunks[nc.next].prev = p
			}
			a.recycle(nx)
		}
		a.resize(l, p, size)
	case nx != 0 && a.chunks[nx].list == l.id:
		nc := &a.chunks[nx]
		nc.prev = p
		if p != 0 {
			a.chunks[p].next = nx
		} else {
			a.blockTab[nc.blk].first = nx
		}
		nc.addr = c.addr
		size := nc.size + c.size
		a.recycle(i)
		a.resize(l, nx, size)
	default:
		c.list = l.id
		a.link(l, i)
		l.n++
	}
}

// newChunk returns the index of an unused chunk; it may grow a.chunks,
// so pointers into it taken before are stale.
func (a *SubAllocator) newChunk() int32 {
	if n := len(a.spare); n > 0 {
		i := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return i
	}
	a.chunks = append(a.chunks, subChunk{})
	return int32(len(a.chunks) - 1)
}

func (a *SubAllocator) recycle(i int32) {
	a.chunks[i] = subChunk{}
	a.spare = append(a.spare, i)
}

// Deallocate gives back a range from Allocate, on s (nil: the upstream's
// default stream): the range is reused at once by allocations on s, and by
// allocations on other streams only once they are ordered after s.
// Buffers call it from Close. A zero ptr is a no-op.
//
// It works after Close too; a block whose last allocation this was is
// then given back to the upstream (after waiting for the streams that
// freed into it). If that fails the block stays, and the next Close
// retries it and reports the error.
//
// An address that is not a live allocation of this sub-allocator (never
// allocated here, or already freed), or a size that does not match the
// allocation's, is an error matching cuda.ErrInvalidArgument, and nothing
// changes.
func (a *SubAllocator) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "SubAllocator.Deallocate"
	if ptr == 0 {
		return nil
	}
	if err := a.check("Deallocate"); err != nil {
		return err
	}
	a.mu.Lock()
	i := a.live.get(uint64(ptr))
	if i == 0 {
		err := a.unknownLocked(op, ptr, size)
		a.mu.Unlock()
		return err
	}
	c := &a.chunks[i]
	if n, ok := alignUp(size, a.align); !ok || n != c.size {
		a.mu.Unlock()
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x: %d bytes given, the allocation has %d (aligned to %d)", uint64(ptr), size, c.size, a.align)
	}
	a.live.remove(uint64(ptr))
	a.used -= c.size
	b := a.blockTab[c.blk]
	b.live--
	a.freeLocked(a.listFor(s), i)
	if !a.closed || b.live > 0 {
		a.mu.Unlock()
		return nil
	}
	r := a.detachLocked(b)
	a.mu.Unlock()
	// The range itself was freed, so Deallocate succeeded whatever
	// happens to the block. If giving it back fails, the block stays and
	// the error is kept for the next Close, which retries and reports it.
	if _, err := a.giveBack([]subRelease{r}); err != nil {
		a.mu.Lock()
		a.deferred = errors.Join(a.deferred, err)
		a.mu.Unlock()
	}
	return nil
}

// unknownLocked explains why ptr is not a live allocation.
func (a *SubAllocator) unknownLocked(op string, ptr cuda.DevicePtr, size uint64) error {
	p := uint64(ptr)
	for _, b := range a.blocks {
		if p >= b.base && p-b.base < b.size {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) is not a live allocation: already freed (double free?), or not the start of one", p, size)
		}
	}
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) was not allocated by this SubAllocator", p, size)
}

// subIndex finds live chunks by address: an open-addressing hash table
// with linear probing and backward-shift deletion. A Go map would do, but
// costs about three times as much here, most of it in deleting (a map
// that becomes empty draws a new random seed, which one-allocation-at-a-
// time workloads hit on every free), and its values would be scanned by
// the collector; hash flooding, which that seed defends against, cannot
// happen with addresses the sub-allocator chose itself.
type subIndex struct {
	slots []subSlot // a power of two long, at most half full
	n     int
	shift uint // 64 - log2(len(slots))
}

type subSlot struct {
	addr uint64 // 0: empty (no allocation starts at address 0)
	c    int32
}

func (x *subIndex) home(addr uint64) uint64 {
	return (addr * 0x9e3779b97f4a7c15) >> x.shift // Fibonacci hashing: the high bits mix every address bit
}

func (x *subIndex) get(addr uint64) int32 {
	if x.n == 0 || addr == 0 {
		return 0
	}
	mask := uint64(len(x.slots) - 1)
	for i := x.home(addr); ; i = (i + 1) & mask {
		switch x.slots[i].addr {
		case addr:
			return x.slots[i].c
		case 0:
			return 0
		}
	}
}

// put adds chunk c at addr, which is not in the index.
func (x *subIndex) put(addr uint64, c int32) {
	if 2*(x.n+1) > len(x.slots) {
		x.resize()
	}
	mask := uint64(len(x.slots) - 1)
	i := x.home(addr)
	for x.slots[i].addr != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = subSlot{addr, c}
	x.n++
}

// remove deletes addr, which is in the index, moving later entries of its
// probe run back so that no tombstones are needed.
func (x *subIndex) remove(addr uint64) {
	mask := uint64(len(x.slots) - 1)
	i := x.home(addr)
	for x.slots[i].addr != addr {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; x.slots[j].addr != 0; j = (j + 1) & mask {
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if h := x.home(x.slots[j].addr); (j-h)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = subSlot{}
	x.n--
}

func (x *subIndex) resize() {
	old := x.slots
	size := max(64, 2*len(old))
	x.slots = make([]subSlot, size)
	x.shift = uint(64 - bits.TrailingZeros(uint(size)))
	x.n = 0
	for _, s := range old {
		if s.addr != 0 {
			x.put(s.addr, s.c)
		}
	}
}

// subRelease is a block detached from the free lists, to be given back to
// the upstream without the lock held: waiting for streams may take long.
type subRelease struct {
	blk     *subBlock
	keys    []*cuda.Stream // the stream of each chunk, in address order, to put them back
	streams []*cuda.Stream // the distinct streams among keys
}

// detachLocked takes a block without live allocations out of the free
// lists, remembering each chunk's stream so that a failed release can put
// them back (the lists themselves may be gone by then).
func (a *SubAllocator) detachLocked(b *subBlock) subRelease {
	b.releasing = true
	r := subRelease{blk: b}
	for i := b.first; i != 0; i = a.chunks[i].next {
		c := &a.chunks[i]
		l := a.listTab[c.list]
		a.unlink(l, i)
		l.n--
		l.bytes -= c.size
		c.list = 0
		r.keys = append(r.keys, l.key)
		if !slices.Contains(r.streams, l.key) {
			r.streams = append(r.streams, l.key)
		}
	}
	return r
}

// restoreLocked puts a detached block that was not given back on the
// lists again, each chunk on the stream it was free on: the block is
// exactly as it was before it was detached, still owned and usable.
func (a *SubAllocator) restoreLocked(r subRelease) {
	b := r.blk
	b.releasing = false
	// Chunks not yet put back are still off the lists, so each one merges
	// only with neighbours already back.
	k := 0
	for i := b.first; i != 0; k++ {
		next := a.chunks[i].next
		a.freeLocked(a.listFor(r.keys[k]), i)
		i = next
	}
}

// dropLocked forgets a detached block whose memory went back to the
// upstream.
func (a *SubAllocator) dropLocked(b *subBlock) {
	for i := b.first; i != 0; {
		next := a.chunks[i].next
		a.recycle(i)
		i = next
	}
	if i := slices.Index(a.blocks, b); i >= 0 {
		a.blocks = slices.Delete(a.blocks, i, i+1)
	}
	a.blockTab[b.id] = nil
	a.freeBlk = append(a.freeBlk, b.id)
	a.held -= b.size
}

// subGiven is what giveBack gave back.
type subGiven struct {
	bytes  uint64 // bytes of the blocks given back (what Reserved dropped by)
	blocks int    // blocks given back
	kept   int    // blocks that could not be given back and are on the lists again
}

// giveBack returns the detached blocks rs to the upstream, in two phases
// so that a failure changes as little as possible:
//
//  1. It waits (on the host) for every stream that freed into any of the
//     blocks, since work queued there may still use the memory. If that
//     fails, nothing has changed: every block goes back on the lists.
//  2. It frees the blocks one by one. A block whose free fails goes back
//     on the lists, still owned and usable; the others are given back
//     anyway (giving back is what the caller asked for, and it is most
//     wanted when memory is short), and the errors are joined.
//
// It returns what was given back and the error; the lock is not held.
func (a *SubAllocator) giveBack(rs []subRelease) (subGiven, error) {
	var g subGiven
	var streams []*cuda.Stream
	var total uint64
	for _, r := range rs {
		total += r.blk.size
		for _, s := range r.streams {
			if !slices.Contains(streams, s) {
				streams = append(streams, s)
			}
		}
	}
	for _, s := range streams {
		if err := a.order.sync(s); err != nil {
			a.mu.Lock()
			for _, r := range rs {
				a.restoreLocked(r)
			}
			a.mu.Unlock()
			g.kept = len(rs)
			what := fmt.Sprintf("%d blocks (%d bytes)", len(rs), total)
			if len(rs) == 1 {
				what = fmt.Sprintf("%#x (%d bytes)", rs[0].blk.base, rs[0].blk.size)
			}
			return g, fmt.Errorf("give back %s to %v: wait for %s: %w", what, a.up, streamName(s), err)
		}
	}
	var errs []error
	for _, r := range rs {
		b := r.blk
		gone, err := a.freeBlock(r)
		a.mu.Lock()
		if gone {
			a.dropLocked(b)
			g.bytes += b.size
			g.blocks++
		} else {
			a.restoreLocked(r)
			g.kept++
		}
		a.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("give back %#x (%d bytes) to %v: %w", b.base, b.size, a.up, err))
		}
	}
	return g, errors.Join(errs...)
}

// freeBlock frees the upstream buffer of a detached block whose streams
// are idle. gone reports whether the memory went back to the upstream
// (possibly with an error about cleaning up after it, which must still be
// reported); when it is false the block is intact.
func (a *SubAllocator) freeBlock(r subRelease) (gone bool, err error) {
	b := r.blk
	// Every stream involved is idle, so any stream orders the free: prefer
	// one that freed into the block, else the block's own.
	var on *cuda.Stream
	for _, s := range r.streams {
		if s != nil {
			on = s
			break
		}
	}
	err = b.buf.CloseOn(on)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, buffer.ErrPartlyFreed):
		// The upstream freed the memory but failed to tidy up after it:
		// the buffer is closed, the block is gone, the error stands.
		return true, err
	case !errors.Is(err, cuda.ErrClosed):
		// A real failure of the free: it is reported, never retried
		// elsewhere and swallowed.
		return false, err
	}
	// That stream was destroyed (its work has finished: see phase 1 of
	// giveBack): free on the upstream's default stream instead.
	ptr, size, derr := b.buf.Disown()
	if derr != nil {
		return false, errors.Join(err, derr)
	}
	uerr := a.up.Deallocate(ptr, size, nil)
	switch {
	case uerr == nil:
		return true, nil
	case errors.Is(uerr, buffer.ErrPartlyFreed):
		return true, uerr
	}
	// Still the block's memory: own it again, so that a retry (and the
	// safety net) can free it.
	b.buf = buffer.Owned(ptr, size, a.up, nil)
	return false, errors.Join(err, uerr)
}

// collectLocked detaches every block without live allocations.
func (a *SubAllocator) collectLocked() []subRelease {
	var rs []subRelease
	for _, b := range a.blocks {
		if b.live == 0 && !b.releasing {
			rs = append(rs, a.detachLocked(b))
		}
	}
	return rs
}

// TrimError is the error of a Trim that failed after it began giving
// blocks back (it is wrapped in the returned error: use errors.As). Trim
// first waits for the streams that freed into the blocks; if that fails,
// nothing has changed (Blocks is 0). Then it gives the blocks back one by
// one: a block whose release fails stays, owned and usable, and the
// others are given back anyway, so a Trim error may come with some
// memory given back — exactly Bytes in Blocks blocks, by which
// SubAllocatorStats.Reserved and Blocks have dropped. Kept is the number
// of entirely free blocks that stayed.
type TrimError struct {
	Bytes  uint64 // bytes given back to the upstream
	Blocks int    // blocks given back
	Kept   int    // free blocks that could not be given back
	Err    error  // what failed
}

// Error is Err's message followed by what was given back (safe on nil and
// zero values, like every method of the package).
func (e *TrimError) Error() string {
	if e == nil {
		return "<nil>"
	}
	msg := "trim failed"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Blocks+e.Kept == 0 {
		return msg
	}
	return fmt.Sprintf("%s (gave back %d of %d free blocks, %d bytes)", msg, e.Blocks, e.Blocks+e.Kept, e.Bytes)
}

// Unwrap returns Err (nil for nil).
func (e *TrimError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// Trim gives back to the upstream every block in which nothing is
// allocated. It first waits (on the host) for the streams that freed into
// those blocks, since their work may still use the memory; a destroyed
// stream is waited for by synchronizing its device. It also forgets the
// streams that hold no free range (and destroys their events), so that
// the sub-allocator does not keep destroyed streams alive.
//
// If waiting fails, nothing is given back. Then the blocks go back one by
// one; a block that cannot be given back stays (still usable) and the
// others go anyway. Any failure is reported: the error wraps a *TrimError
// that says exactly what was given back, and every underlying error
// (joined) with the blocks it concerns. After Close, Trim returns an
// error matching cuda.ErrClosed.
func (a *SubAllocator) Trim() error {
	const op = "SubAllocator.Trim"
	if err := a.check("Trim"); err != nil {
		return err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	rs := a.collectLocked()
	var errs []error
	kept := a.streams[:0]
	for _, l := range a.streams {
		if l.n > 0 {
			kept = append(kept, l)
			continue
		}
		if err := a.order.forget(l.key); err != nil {
			// The orderer keeps what it could not drop: keep the list
			// too, so that the next Trim retries (and Close in any case).
			errs = append(errs, fmt.Errorf("forget %s: %w", streamName(l.key), err))
			kept = append(kept, l)
			continue
		}
		delete(a.lists, l.key)
		a.listTab[l.id] = nil
		a.freeList = append(a.freeList, l.id)
	}
	clear(a.streams[len(kept):])
	a.streams = kept
	a.last = nil
	a.mu.Unlock()
	g, err := a.giveBack(rs)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return &cuda.OpError{Op: op, Err: &TrimError{Bytes: g.bytes, Blocks: g.blocks, Kept: g.kept, Err: err}}
	}
	return nil
}

// Close gives every block back to the upstream (after waiting for the
// streams that freed into them) and destroys the sub-allocator's events;
// later Allocate and Trim calls return errors matching cuda.ErrClosed.
// It does not close the upstream.
//
// If allocations are still live, their blocks stay until the allocations
// are deallocated (each block goes back with its last one), and Close
// returns an error matching cuda.ErrorIllegalState that says how many
// there are. Every failure (an event not destroyed, a stream not waited
// for, a block not given back) is reported, joined; what failed stays
// held, and Close is idempotent: called again it retries what failed and
// reports the allocations still live.
func (a *SubAllocator) Close() error {
	const op = "SubAllocator.Close"
	if a == nil || a.up == nil {
		return nil
	}
	a.mu.Lock()
	var errs []error
	a.closed = true
	if !a.orderDone {
		// Retried by every Close until it succeeds: an event the driver
		// failed to destroy stays with the orderer until then.
		if err := a.order.close(); err != nil {
			errs = append(errs, err)
		} else {
			a.orderDone = true
		}
	}
	rs := a.collectLocked()
	// Releases that failed in Deallocate are retried now (their blocks
	// went back on the lists and are collected above); their old errors
	// are superseded by the retry's.
	a.deferred = nil
	a.mu.Unlock()
	if _, err := a.giveBack(rs); err != nil {
		errs = append(errs, err)
	}
	a.mu.Lock()
	if n := a.live.n; n > 0 {
		errs = append(errs, fmt.Errorf("%d allocations (%d bytes) are still live; their blocks are given back as they are deallocated: %w", n, a.used, cuda.ErrorIllegalState))
	}
	a.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	return nil
}

// IsClosed reports whether Close has been called (true for nil).
func (a *SubAllocator) IsClosed() bool {
	if a == nil || a.up == nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// Stats returns a snapshot of the sub-allocator's books (zero for nil).
func (a *SubAllocator) Stats() SubAllocatorStats {
	if a == nil || a.up == nil {
		return SubAllocatorStats{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := SubAllocatorStats{
		Reserved:    a.held,
		Used:        a.used,
		Free:        a.freeBytesLocked(),
		Blocks:      len(a.blocks),
		Allocations: a.live.n,
	}
	for _, l := range a.streams {
		st.FreeRanges += l.n
	}
	return st
}

func (a *SubAllocator) freeBytesLocked() uint64 {
	var n uint64
	for _, l := range a.streams {
		n += l.bytes
	}
	return n
}

// Upstream is the resource the sub-allocator takes its blocks from.
func (a *SubAllocator) Upstream() buffer.MemoryResource {
	if a == nil {
		return nil
	}
	return a.up
}

// DeviceAccessible reports whether the upstream's memory is usable by
// kernels (false for nil).
func (a *SubAllocator) DeviceAccessible() bool {
	return a != nil && a.up != nil && a.up.DeviceAccessible()
}

// HostAccessible reports whether the CPU can use the upstream's memory
// (false for nil).
func (a *SubAllocator) HostAccessible() bool { return a != nil && a.up != nil && a.up.HostAccessible() }

// DeviceID is the upstream's device (-1 for nil and zero values).
func (a *SubAllocator) DeviceID() int {
	if a == nil || a.up == nil {
		return -1
	}
	return a.up.DeviceID()
}

// String describes the sub-allocator for logs.
func (a *SubAllocator) String() string {
	if a == nil || a.up == nil {
		return "SubAllocator(nil)"
	}
	st := a.Stats()
	closed := ""
	if a.IsClosed() {
		closed = ", closed"
	}
	return fmt.Sprintf("SubAllocator(%v, %d blocks, %d bytes reserved, %d used%s)", a.up, st.Blocks, st.Reserved, st.Used, closed)
}

// streamName names a stream key for messages.
func streamName(s *cuda.Stream) string {
	if s == nil {
		return "the default stream"
	}
	if s.Device() == nil {
		return fmt.Sprintf("stream %p", s)
	}
	if s.IsDefault() {
		return fmt.Sprintf("the default stream of %v", s.Device())
	}
	return fmt.Sprintf("stream %#x", s.Handle())
}

// subOrderer is how the sub-allocator orders streams and waits for them:
// events and stream synchronization in production, a recorder in tests
// (which have no driver, so streams there are only map keys). nil stands
// for the upstream's default stream. waitFor, forget and close are called
// with the sub-allocator's lock held; sync without it.
type subOrderer interface {
	// waitFor makes work submitted to dst from now on wait for the work
	// submitted to src so far, without blocking the host.
	waitFor(dst, src *cuda.Stream) error
	// sync blocks until the work submitted to s so far has finished.
	sync(s *cuda.Stream) error
	// forget drops what the orderer keeps for s (its event). On failure
	// the orderer keeps it, for a later forget or close to retry.
	forget(s *cuda.Stream) error
	// close drops everything; what fails to drop stays, for the next
	// close to retry.
	close() error
}

// eventOrder is the production subOrderer: one event per source stream,
// made when first needed and re-recorded for each later ordering (a
// stream's wait captures the event's state when it is queued, so reusing
// it is safe).
type eventOrder struct {
	device func() (*cuda.Device, error) // the upstream's device, for the nil stream
	events map[*cuda.Stream]*cuda.Event
}

func newEventOrder(devID int) *eventOrder {
	return &eventOrder{
		// Host memory (-1) belongs to no device; its default stream, as
		// the other resources take it, is device 0's. Looked up at each
		// use (cuda.GetDevice is a slice index once the devices are
		// known), not cached with sync.OnceValues: a failure on first use
		// must not fail every later call (issue 6).
		device: func() (*cuda.Device, error) { return cuda.GetDevice(max(devID, 0)) },
		events: make(map[*cuda.Stream]*cuda.Event),
	}
}

// stream resolves nil to the upstream device's legacy default stream.
// A zero Stream (not from a device) is an error, not a panic later.
func (o *eventOrder) stream(s *cuda.Stream) (*cuda.Stream, error) {
	if s != nil {
		if s.Device() == nil {
			return nil, cuda.Errorf("SubAllocator", cuda.ErrInvalidArgument, "zero stream (use Device.NewStream, or nil for the default stream)")
		}
		return s, nil
	}
	d, err := o.device()
	if err != nil {
		return nil, err
	}
	return d.DefaultStream(), nil
}

func (o *eventOrder) waitFor(dst, src *cuda.Stream) error {
	ds, err := o.stream(dst)
	if err != nil {
		return err
	}
	ss, err := o.stream(src)
	if err != nil {
		return err
	}
	e := o.events[src]
	if e == nil {
		if e, err = ss.Device().NewEvent(cuda.EventDisableTiming); err != nil {
			return err
		}
		o.events[src] = e
	}
	if err := e.Record(ss); err != nil {
		if !errors.Is(err, cuda.ErrClosed) {
			return err
		}
		// src was destroyed: the driver still finishes its work, and
		// waiting for the device covers it.
		return ss.Device().Sync()
	}
	return ds.WaitEvent(e)
}

func (o *eventOrder) sync(s *cuda.Stream) error {
	ss, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := ss.Sync(); err != nil {
		if !errors.Is(err, cuda.ErrClosed) {
			return err
		}
		return ss.Device().Sync() // destroyed: see waitFor
	}
	return nil
}

// forget destroys s's event. An event the driver fails to destroy stays
// in the map, so that a later forget or close retries it instead of
// leaking it.
func (o *eventOrder) forget(s *cuda.Stream) error {
	e := o.events[s]
	if e == nil {
		return nil
	}
	if err := e.Close(); err != nil {
		return err
	}
	delete(o.events, s)
	return nil
}

// close destroys every event; those the driver fails to destroy stay for
// the next close (see forget).
func (o *eventOrder) close() error {
	var errs []error
	for s, e := range o.events {
		if err := e.Close(); err != nil {
			errs = append(errs, fmt.Errorf("destroy the event of %s: %w", streamName(s), err))
			continue
		}
		delete(o.events, s)
	}
	return errors.Join(errs...)
}
