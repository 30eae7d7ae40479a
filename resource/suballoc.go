package resource

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

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
	// no free range fits a request; 0 means 64 MiB. A larger request gets
	// a block of its own size, which Trim gives back once it is free.
	GrowSize uint64
	// MaxSize caps the bytes held from the upstream; 0 means no cap.
	// Beyond it Allocate fails with an error matching
	// cuda.ErrorOutOfMemory (after giving back the free blocks, when that
	// can make room: see SubAllocatorStats.OutOfMemoryTrims).
	MaxSize uint64
	// Alignment of every allocation's address and size, a power of two; 0
	// means 256 bytes, what cudaMalloc guarantees and what RMM uses.
	Alignment uint64
	// Segments, if set, sees every block (segment) taken from the upstream
	// and given back: see SegmentHooks.
	Segments *SegmentHooks
	// Release, if set, gives blocks back as they fall free: see
	// ReleasePolicy. A SubAllocator with a policy has no per-stream
	// caches, so that a freed range is back in its block at once.
	Release *ReleasePolicy
}

// SegmentHooks let code that must know the memory behind allocations,
// such as a communication library that registers buffers (NCCL's
// ncclCommRegister), see the large blocks a SubAllocator takes from its
// upstream and gives back, rather than every allocation carved from them,
// as RMM's callback_memory_resource does.
//
// Acquired runs once a block is taken from the upstream, before anything
// is carved from it; if it fails, the block goes back to the upstream and
// the allocation that needed it fails with an error wrapping the hook's.
// Released runs before a block goes back to the upstream (Trim, Close, a
// trim on out-of-memory, or, after Close, the block's last Deallocate);
// if it fails, the block stays, owned and still acquired, the operation
// reports the error, and a later Trim or Close calls Released again. So
// each block that Acquired accepted sees Released exactly once, before
// its memory is released. If giving the block back then fails, it stays
// and Acquired runs again for it; if that fails too, both errors are
// reported and the block stays in use unregistered.
//
// Acquired runs with the SubAllocator's shared lock held, so that no
// allocation sees the block before it is acquired: while it runs, every
// allocation its stream's cache cannot serve waits. Released (and
// Acquired again for a block that could not be given back) runs without
// that lock, on the goroutine that gives the block back; Close waits for
// it. A hook may block, but must not call the SubAllocator it serves, nor
// wait for a goroutine that does: it would deadlock.
//
// A hook that panics counts as one that failed, and leaves the
// SubAllocator usable, closable and with its books whole; the panic goes
// on to the caller of the operation that ran the hook. A new block whose
// Acquired panicked has gone back to the upstream; a block whose Released
// panicked stays acquired, and so do the blocks the operation had not
// given back yet, for a later Trim or Close. A Deallocate that runs
// Released has freed its range first.
//
// A SubAllocator that is dropped without Close leaves its blocks to the
// Buffers' safety net, which frees them without calling Released.
type SegmentHooks struct {
	Acquired func(ptr cuda.DevicePtr, size uint64) error
	Released func(ptr cuda.DevicePtr, size uint64) error
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
// memory, an adaptor). A pair through a driver pool costs a driver call
// each way; carving a range out of memory already held is a few dozen
// nanoseconds of Go. Allocate and Deallocate on one stream never call the
// driver once the sub-allocator holds enough memory, and scale with
// goroutines on their own streams (BENCHMARKS.md has the figures).
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
// # Concurrency
//
// A SubAllocator is safe for concurrent use, and goroutines on different
// streams do not contend: each stream has a cache in front of the shared
// books (as RMM's arena keeps per-thread arenas in front of a global
// one), and a pair it serves takes only a lock of that cache. Goroutines
// sharing one stream, once seen contending, get a shard of its cache per
// P. A cache reuses ranges freed on its stream for allocations of the
// same aligned size on that stream; other sizes, frees on another stream
// than the allocation's and a full cache take the shared lock. Cached
// ranges count as free: they go back to the books before the
// sub-allocator orders streams or grows, and in Trim, Close and Stats, so
// caching never makes it grow while a fitting range is free, and Stats is
// exact.
//
// The blocks are Buffers of the upstream's (buffer.Allocate), so the
// safety net covers them; the allocations are addresses (AllocatePtr), so
// adaptors stacked on a SubAllocator build one Buffer per allocation.
type SubAllocator struct {
	// Read by the fast path, written only by the constructor (and caches
	// replaced under mu): kept apart from mu, which the slow paths write.
	up               buffer.MemoryResource
	align, grow, max uint64
	segs             SegmentHooks
	release          *ReleasePolicy // nil: blocks stay until Trim or Close
	cacheBytes       uint64         // the most bytes a stream's cache keeps free; 0: no caches
	caches           atomic.Pointer[subCaches]
	_                [64]byte

	order subOrderer

	mu      sync.Mutex
	closed  bool
	lists   map[*cuda.Stream]*subList
	streams []*subList  // the lists in creation order, for deterministic stealing
	last    *subList    // the list used last: the common one-stream case skips the map
	live    subIndex    // live chunks by address
	blocks  []*subBlock // sorted by base address
	used    uint64      // bytes of live allocations (aligned sizes)
	held    uint64      // bytes held from the upstream
	peak    uint64      // the most held at once
	oomTrim uint64      // allocations out of memory that trimmed and retried

	deferred  error // failures of releases Deallocate ran after Close, for the next Close
	orderDone bool  // order.close succeeded; until then every Close retries it

	// releasing counts the blocks detached for a release still under way
	// (detachLocked until dropLocked or restoreLocked); Close waits on
	// released until it is 0, so that it neither returns while another
	// goroutine's Trim still holds a block nor misses one restored late.
	releasing int
	released  sync.Cond // L is &mu, set when first waited on

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

	// The per-stream caches (see subCache): by stream, and by id.
	cacheMap  map[*cuda.Stream]*subCache
	cacheTab  []*subCache
	freeCache []int32 // unused cache ids
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
	// OutOfMemoryTrims counts the allocations that ran out of memory,
	// gave back the entirely free blocks (Trim) and tried again. One that
	// would not fit under MaxSize even then fails at once, every block
	// kept.
	OutOfMemoryTrims uint64
}

// NewSubAllocator returns a sub-allocator over upstream, which it uses
// but does not own (close the upstream after the sub-allocator). With
// opts.InitialSize set it takes that much from the upstream now, on the
// upstream's default stream. Bad options and a nil upstream are errors
// matching cuda.ErrInvalidArgument; the upstream's error is returned
// wrapped if the initial block cannot be had.
func NewSubAllocator(upstream buffer.MemoryResource, opts *SubAllocatorOptions) (*SubAllocator, error) {
	const op = "NewSubAllocator"
	if upstream == nil || holdsNil(upstream) {
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
		segs:  segmentHooks(o.Segments),
		grow:  grow,
		max:   o.MaxSize,
		order: newEventOrder(upstream.DeviceID()),
		lists: make(map[*cuda.Stream]*subList),
		// Index 0 of each table is the "none" entry.
		chunks:   make([]subChunk, 1, 64),
		blockTab: []*subBlock{nil},
		listTab:  []*subList{nil},
		cacheTab: []*subCache{nil},
		cacheMap: make(map[*cuda.Stream]*subCache),
		// A stream's cache keeps up to a quarter of a growth step free,
		// so that sizes up to that are served without the shared lock.
		cacheBytes: grow / 4,
	}
	if o.Release != nil {
		p := *o.Release
		a.release, a.cacheBytes = &p, 0
	}
	if o.InitialSize > 0 {
		n, ok := alignUp(o.InitialSize, o.Alignment)
		if !ok {
			return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "InitialSize %d overflows when aligned to %d bytes", o.InitialSize, o.Alignment)
		}
		if err := a.growInitial(op, n); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// growInitial takes the initial block of n bytes (see NewSubAllocator).
func (a *SubAllocator) growInitial(op string, n uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock() // the upstream and the Acquired hook may panic
	return a.growLocked(op, a.listFor(nil), n, n, nil)
}

// alignUp rounds n up to a multiple of the power of two align; ok is false
// on overflow.
func alignUp(n, align uint64) (uint64, bool) {
	m := (n + align - 1) &^ (align - 1)
	return m, m >= n
}

func (a *SubAllocator) check(op string) error {
	if a == nil || a.up == nil {
		// Not errZero: inlined there, it would keep check from inlining
		// into the pair's hot path.
		return cuda.Errorf("SubAllocator."+op, cuda.ErrInvalidArgument, "SubAllocator is not initialized (create it with NewSubAllocator)")
	}
	return nil
}

// Allocate returns a buffer of size bytes usable on s at once (nil: the
// upstream's default stream), carved out of memory the sub-allocator
// holds; closing the buffer gives the range back on s unless CloseOn
// names another stream. Size 0 returns an empty buffer.
//
// A request beyond MaxSize, or one the upstream cannot grow for, fails
// with an error matching cuda.ErrorOutOfMemory that names the sizes; a
// size that overflows when aligned matches cuda.ErrInvalidArgument; after
// Close, and on a closed stream, the error matches cuda.ErrClosed.
func (a *SubAllocator) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(a, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address of a new range of size bytes usable on s (0 for size 0),
// and s. Free it with Deallocate.
func (a *SubAllocator) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if err := a.check("Allocate"); err != nil {
		return 0, nil, err
	}
	ptr, err := a.take(size, s)
	if err != nil && errors.Is(err, cuda.ErrorOutOfMemory) {
		ptr, err = a.retryAfterTrim(size, s, err)
	}
	if err != nil {
		return 0, nil, err
	}
	return ptr, s, nil
}

// take is Allocate without the Buffer: it returns the address of a new
// range of size bytes on s (0 for size 0).
func (a *SubAllocator) take(size uint64, s *cuda.Stream) (cuda.DevicePtr, error) {
	const op = "SubAllocator.Allocate"
	// Ranges are handed out and reused by the host, outside the stream
	// order a graph records: a captured allocation would be carved once,
	// now, not at each launch.
	if err := a.order.admit(op, s, true); err != nil {
		return 0, err
	}
	n, ok := alignUp(size, a.align)
	if !ok {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "%d bytes overflow when aligned to %d bytes", size, a.align)
	}
	// A closed stream gets nothing, even a range freed on it and cached
	// here: the pools refuse it, and work queued on it is an error.
	if err := refuseClosed(op, s); err != nil {
		return 0, err
	}
	var h uint32 // the shard hint the fast path used, for recordLocked
	if size > 0 {
		var addr uint64
		if addr, h, ok = a.fastTake(n, s); ok {
			return cuda.DevicePtr(addr), nil
		}
	}
	return a.takeSlow(op, size, n, s, h)
}

// takeSlow is take past the caches, under the shared lock. The unlock is
// deferred: growing calls user code (the upstream, the Acquired hook)
// that may panic.
func (a *SubAllocator) takeSlow(op string, size, n uint64, s *cuda.Stream, h uint32) (cuda.DevicePtr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if size == 0 {
		return 0, nil
	}
	l := a.listFor(s)
	i := a.find(l, n)
	if i == 0 {
		var err error
		if i, err = a.slowLocked(l, n, s); err != nil {
			return 0, err
		}
	}
	i = a.carveLocked(l, i, n)
	c := &a.chunks[i]
	addr := c.addr
	a.live.put(addr, i, n)
	a.used += n
	a.blockTab[c.blk].live++
	a.recordLocked(s, i, h)
	return cuda.DevicePtr(addr), nil
}

// refuseClosed refuses a stream closed by its owner with the error the
// pools give for it (cuda.ResolveStream): it matches cuda.ErrClosed.
func refuseClosed(op string, s *cuda.Stream) error {
	if s == nil || !s.IsClosed() || s.Device() == nil {
		return nil
	}
	_, err := s.Device().ResolveStream(op, s, false)
	return err
}

// Deallocate gives back a range from Allocate, on s (nil: the upstream's
// default stream): the range is reused at once by allocations on s, and by
// allocations on other streams only once they are ordered after s. A zero
// ptr is a no-op. It works after Close too: a block whose last allocation
// this was is then given back to the upstream; if that fails the block
// stays, and the next Close retries it and reports the error. Before
// Close, with a ReleasePolicy, the blocks the policy gives back go now:
// if that fails the range is freed all the same, the blocks stay free,
// and the error wraps buffer.ErrPartlyFreed.
//
// An address that is not a live allocation here (never allocated, or
// already freed), or a size that does not match the allocation's, is an
// error matching cuda.ErrInvalidArgument, and nothing changes. A closed
// stream is refused, as the pools refuse it, with an error matching
// cuda.ErrClosed: the range stays allocated, and may be freed on another
// stream (Buffer.CloseOn).
func (a *SubAllocator) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "SubAllocator.Deallocate"
	if ptr == 0 {
		return nil
	}
	if err := a.check("Deallocate"); err != nil {
		return err
	}
	if err := a.order.admit(op, s, false); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays allocated)", err, uint64(ptr), size)
	}
	// Before any cache sees it: nothing may be ordered on a closed stream,
	// so a range freed on it could be reused only after its whole device.
	if err := refuseClosed(op, s); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays allocated)", err, uint64(ptr), size)
	}
	if done, err := a.fastFree(ptr, size, s); done {
		return err
	}
	a.mu.Lock()
	i := a.live.get(uint64(ptr))
	if i == 0 || !a.handedOutLocked(i, false) {
		// Not live, or a range a cache holds free: freed already.
		err := a.unknownLocked(op, ptr, size)
		a.mu.Unlock()
		return err
	}
	c := &a.chunks[i]
	if n, ok := alignUp(size, a.align); !ok || n != c.size {
		a.mu.Unlock()
		return a.sizeErr(ptr, size, c.size)
	}
	if !a.handedOutLocked(i, true) {
		// A racing second free reached the cache first.
		err := a.unknownLocked(op, ptr, size)
		a.mu.Unlock()
		return err
	}
	a.live.remove(uint64(ptr))
	a.used -= c.size
	b := a.blockTab[c.blk]
	b.live--
	a.freeLocked(a.listFor(s), i)
	var rs []subRelease
	closed := a.closed
	switch {
	case b.live > 0:
	case closed:
		rs = []subRelease{a.detachLocked(b)}
	case a.release != nil:
		rs = a.fallenLocked(b)
	}
	a.mu.Unlock()
	if len(rs) == 0 {
		return nil
	}
	// The range itself was freed whatever happens to the block: a block
	// that cannot be given back stays, free, and a later Trim or Close
	// retries it. After Close the error waits for the next Close, which
	// reports it; before, it is this call's, "done, but not tidy".
	_, err := a.giveBack(rs)
	switch {
	case err == nil:
	case closed:
		a.mu.Lock()
		a.deferred = errors.Join(a.deferred, err)
		a.mu.Unlock()
	default:
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%w: %#x (%d bytes) is free, its block stays held: %w", buffer.ErrPartlyFreed, uint64(ptr), size, err)}
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
	a.flushAllLocked() // the caches' free ranges, back in the books
	st := SubAllocatorStats{
		Reserved:         a.held,
		Used:             a.used,
		Free:             a.freeBytesLocked(),
		Blocks:           len(a.blocks),
		Allocations:      a.live.n,
		OutOfMemoryTrims: a.oomTrim,
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

// PeakReserved is the most SubAllocatorStats.Reserved has been (0 for
// nil): with a ReleasePolicy, the peak of the memory it mapped.
func (a *SubAllocator) PeakReserved() uint64 {
	if a == nil || a.up == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak
}

// Upstream is the resource the sub-allocator takes its blocks from.
func (a *SubAllocator) Upstream() buffer.MemoryResource {
	if a == nil {
		return nil
	}
	return a.up
}

// DeviceAccessible, HostAccessible and DeviceID answer for the upstream
// (false, false and -1 for nil and zero values).
func (a *SubAllocator) DeviceAccessible() bool { return upDeviceAccessible(a.Upstream()) }
func (a *SubAllocator) HostAccessible() bool   { return upHostAccessible(a.Upstream()) }
func (a *SubAllocator) DeviceID() int          { return upDeviceID(a.Upstream()) }

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
