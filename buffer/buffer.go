package buffer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cudamem/cudamem/cuda"
)

// MemoryResource hands out and takes back memory, as addresses: the
// interface resources implement and compose through (package resource's
// pools, adaptors and sub-allocator; any type with these methods). Buffers
// are built in one place, [Allocate], which asks a resource for an address
// and wraps it in a Buffer the resource owns; each concrete resource's
// Allocate method is a call of it. Adaptors forward addresses only.
//
// AllocatePtr and Deallocate are stream-ordered: the memory may be used on
// the returned stream as soon as AllocatePtr returns, and is reused only
// after work already submitted to s when Deallocate is called has
// finished. A nil stream means the resource's default (the legacy default
// stream of its device). Implementations must be safe for concurrent use,
// and return errors, never panic, on nil and zero values.
type MemoryResource interface {
	// AllocatePtr allocates size bytes ordered on s and returns the
	// address (0 for size 0) and the stream the memory is ordered on: s,
	// or the stream the resource takes a nil s for (what Buffer.Stream
	// reports). The memory belongs to the caller, with no safety net: it
	// must reach Deallocate of the same resource exactly once, directly
	// or through a Buffer ([Allocate], [Owned]).
	AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error)
	// Deallocate frees memory this resource allocated. Buffers call it from
	// Close; user code rarely needs to.
	Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error
	// DeviceAccessible reports whether kernels can use the memory.
	DeviceAccessible() bool
	// HostAccessible reports whether the CPU can read and write the memory
	// directly (see Buffer.Bytes).
	HostAccessible() bool
	// DeviceID is the ordinal of the device the memory belongs to, or -1 if
	// it belongs to none (pinned host memory).
	DeviceID() int
}

// Allocate returns a new Buffer of exactly size bytes from mr, owned by mr
// (its Close calls mr.Deallocate): the one place Buffers are built from a
// resource. Size 0 is allowed and returns an empty buffer. Errors from mr
// are returned unchanged (they name the operation and the sizes).
func Allocate(mr MemoryResource, size uint64, s *cuda.Stream) (*Buffer, error) {
	if mr == nil {
		return nil, cuda.Errorf("buffer.Allocate", cuda.ErrInvalidArgument, "nil MemoryResource")
	}
	ptr, s, err := mr.AllocatePtr(size, s)
	if err != nil {
		return nil, err
	}
	if ptr == 0 || uint64(ptr)+size < uint64(ptr) || size > maxTracked {
		// Nothing to free, a range no memory can have, or a size its
		// slab's side cannot record (see slabSide): no slab.
		return Owned(ptr, size, mr, s), nil
	}
	w := initBit | ownedBit
	if handoffs.Load() > 0 {
		w |= inheritViewed(ptr)
	}
	return newTracked(ptr, size, mr, s, w), nil
}

// leaks counts buffers garbage collected without Close; leaksKept counts
// those among them whose memory the safety net did not free.
var leaks, leaksKept atomic.Int64

// Leaks returns how many owned buffers were garbage collected without
// Close. The safety net frees their memory, except for those counted by
// [LeaksKept]. Tests assert it stays 0.
func Leaks() int64 { return leaks.Load() }

// LeaksKept returns how many of the buffers counted by [Leaks] kept their
// memory instead: the safety net never frees memory under a host view
// ([Buffer.Bytes]) that was handed out, because the []byte does not keep
// the Buffer alive and may still be in use; and it gives up when the
// resource refuses to free (on the allocation stream and on the default
// one). That memory stays allocated for the life of the process.
func LeaksKept() int64 { return leaksKept.Load() }

// The state word (Buffer.word) of an owner or a borrowed buffer: the
// count of calls in progress in the low bits, then flags. It replaces a
// lock, and costs the hot path no atomic operation in Allocate (the
// Buffer is not shared yet), two in Close (taking closingBit, then
// trading it for closedBit), and one each in acquire and release around
// each call.
//
// The word never makes a call wait for another call. acquire adds one to
// the count and fails (undoing the add) while a Close or Disown holds
// closing or after closed, reporting the buffer closed. So a call that
// holds one buffer and takes another (a copy, a Use whose function
// touches other buffers) never waits behind a pending Close, and no order
// among buffers is needed. Only Close and Disown wait: for the calls in
// progress, and for another Close of the same buffer; they block on the
// lazily made ext's condition variable, with waiters set so that the
// release that lets them go wakes them.
//
// A view's word holds only initBit and closedBit (its own Close); calls
// on a view count on its root's word.
const (
	readerMask = 1<<32 - 1
	closingBit = uint64(1) << 32 // a Close or Disown owns the buffer: calls fail, other closers wait
	closedBit  = uint64(1) << 33 // closed or disowned (views: closed by their own Close)
	waitersBit = uint64(1) << 34 // a closer waits on ext.cond: releases and the end of a Close broadcast
	viewedBit  = uint64(1) << 35 // a host view (Bytes) was handed out: the safety net never frees it
	ownedBit   = uint64(1) << 36 // made with a resource: Close frees through it
	badBit     = uint64(1) << 37 // no use is valid: a null address, or a range past 2^64
	initBit    = uint64(1) << 38 // made by a constructor (the zero Buffer lacks it)

	// A Buffer from a slab (see leaks.go) has its slot in the slab and
	// the index of its home in the slab's side: set when it is made,
	// never changed.
	slotShift = 40 // 8 bits
	homeShift = 48 // 3 bits (slabHomes)
)

// ext is what few buffers need, made on first need so that the common
// owned buffer is one small object: a view's link to the buffer it was
// sliced from; an owner's (or borrowed buffer's) Holds, the closers'
// waiting room, and the driver's description of the memory.
type ext struct {
	root   *Buffer // views: the owner or borrowed buffer whose memory they share
	parent *Buffer // views: the buffer this one was sliced from

	// Owned's buffers: the resource and stream (a slab's Buffers find
	// theirs in the slab's side).
	home home

	mu   sync.Mutex // with cond: closers wait here (see the state word)
	cond sync.Cond

	// holds counts the live Holds (the low bits) and has heldFree set
	// once a Close found holds and left the free to the last Release;
	// freeMR and freeStream are then the resource and the stream that
	// Close would have freed on. See hold.go.
	holds      atomic.Uint64
	freeMR     MemoryResource
	freeStream *cuda.Stream

	// The driver's description of the allocation (cuPointerGetAttribute),
	// asked when needed and kept once answered: for borrowed buffers'
	// accessors, and to tell pinned from managed memory in host copies.
	info atomic.Pointer[pointerInfo]
}

// ext returns b's ext, making it if it has none. Racing first calls agree
// on one.
func (b *Buffer) ext() *ext {
	if x := b.x.Load(); x != nil {
		return x
	}
	x := new(ext)
	x.cond.L = &x.mu
	if b.x.CompareAndSwap(nil, x) {
		return x
	}
	return b.x.Load()
}

type pointerInfo struct {
	info cuda.PointerInfo
}

// pointerInfo returns the driver's description of the allocation (r is
// a root: an owner or a borrowed buffer). Racing first calls may both ask
// the driver; the answers are the same. Only an answer is kept: a failed
// query (no driver yet, memory the driver does not know, a transient
// error) is asked again next time, so that one failure does not decide
// the buffer's accessibility for good.
func (r *Buffer) pointerInfo() (cuda.PointerInfo, error) {
	if x := r.x.Load(); x != nil {
		if pi := x.info.Load(); pi != nil {
			return pi.info, nil
		}
	}
	info, err := cuda.QueryPointer(r.ptr)
	if err != nil {
		return cuda.PointerInfo{}, err
	}
	r.ext().info.Store(&pointerInfo{info: info})
	return info, nil
}

// Buffer is a range of memory: device, pinned host, managed, or anything a
// MemoryResource hands out. An owned Buffer (made by a resource, or by
// Owned) frees its memory through the resource on Close; a borrowed one
// (FromPointer) never frees. Views (Slice) share their parent's memory and
// lifetime.
//
// Any use after Close returns an error matching cuda.ErrClosed. Close is
// idempotent. A Buffer lost without Close is freed by the safety net when
// garbage collected and counted by Leaks; do not rely on it, since the
// collector may run late or never.
//
// Methods are safe for concurrent use; Close waits for calls in progress,
// and calls that start while a Close is in progress fail with an error
// matching cuda.ErrClosed (even if that Close then fails and the buffer
// stays open).
//
// The zero Buffer is not usable: its methods return an error matching
// cuda.ErrInvalidArgument (Close returns nil, and accessors zero values).
//
// A Buffer from Allocate is 40 bytes in a slab of them (see leaks.go): the
// fields below, whose only pointers are to its own slab (which the
// collector skips at once while it scans the slab) and to the rarely made
// ext. Its resource and stream are in a home it shares with the slab's
// other Buffers of that resource and stream, and its entry for the safety
// net, in the slab's side; its state word says which. A view, an Owned
// buffer, a held buffer, and one whose Close waits for calls have an ext.
type Buffer struct {
	word atomic.Uint64       // see the state word; views: their own closedBit
	ptr  cuda.DevicePtr      // this buffer's address (a view's: its root's plus its offset)
	size uint64              // this buffer's (or view's) size
	sl   *slab               // the slab it was carved from, or nil; never changes
	x    atomic.Pointer[ext] // views: set by Slice (with their root); Owned: set by it (with the home); others: made on first need
}

// home is what an owned Buffer needs besides its range: the resource that
// frees it and the stream it was allocated on. The Buffers of a slab
// allocated from one resource on one stream share one, in the slab's side
// (see leaks.go); Owned's buffers have theirs in their ext. Never changed
// once a Buffer uses it.
type home struct {
	mr     MemoryResource
	stream *cuda.Stream
}

// homeOf returns the home of root r (an owner or a borrowed buffer, never
// a view), whose state word is w (any load: the bits it reads never
// change), or nil if it has none (a borrowed buffer).
func (r *Buffer) homeOf(w uint64) *home {
	if sl := r.sl; sl != nil {
		return &sl.side.homes[w>>homeShift&metaHome]
	}
	if x := r.x.Load(); x != nil {
		return &x.home
	}
	return nil
}

// resource is b's resource (its root's for a view; nil for borrowed
// buffers).
func (b *Buffer) resource() MemoryResource {
	r := b.rootOf()
	if h := r.homeOf(r.word.Load()); h != nil {
		return h.mr
	}
	return nil
}

// allocStream is b's allocation stream (its root's for a view; nil if
// none).
func (b *Buffer) allocStream() *cuda.Stream {
	r := b.rootOf()
	if h := r.homeOf(r.word.Load()); h != nil {
		return h.stream
	}
	return nil
}

// view returns b's ext if b is a view, else nil.
func (b *Buffer) view() *ext {
	if x := b.x.Load(); x != nil && x.root != nil {
		return x
	}
	return nil
}

// rootOf returns the buffer whose word counts b's calls: b's root for a
// view, b itself otherwise.
func (b *Buffer) rootOf() *Buffer {
	if x := b.view(); x != nil {
		return x.root
	}
	return b
}

// off is b's offset in its root's range (0 but for views).
func (b *Buffer) off() uint64 { return uint64(b.ptr - b.rootOf().ptr) }

// Owned wraps memory that mr allocated or mapped: Close will call
// mr.Deallocate(ptr, size, s), on s unless CloseOn names another stream.
// Resources use it for memory they mapped rather than allocated
// (imports), and for the Buffers they keep: a SubAllocator's blocks, say.
// Unlike [Allocate]'s Buffers, which share slabs with the Buffers
// allocated around them, an Owned buffer is watched by the safety net on
// its own (a finalizer of its own, a few hundred nanoseconds more): a
// Buffer kept by a resource must not share a slab with the Buffers that
// resource hands out, or those Buffers, when leaked, would reach their own
// slab through the resource, and the net could never free them. A range
// no memory can have (address 0 with a nonzero size, or ptr+size past
// 2^64) makes a buffer whose every use but Close fails with an error
// matching cuda.ErrInvalidArgument.
func Owned(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream) *Buffer {
	w := initBit
	if badRange(ptr, size) {
		w |= badBit
	}
	b := new(Buffer)
	if mr != nil {
		w |= ownedBit
		if ptr != 0 {
			runtime.SetFinalizer(b, collectOne)
			if handoffs.Load() > 0 {
				w |= inheritViewed(ptr)
			}
		}
	}
	if mr != nil || s != nil {
		x := new(ext)
		x.cond.L = &x.mu
		x.home = home{mr: mr, stream: s}
		b.x.Store(x)
	}
	b.ptr, b.size = ptr, size
	b.word.Store(w)
	return b
}

// FromPointer wraps memory owned elsewhere (another library, a kernel's
// output, an imported mapping). The Buffer never frees it; Close only stops
// further use. Accessibility and device are asked of the driver. A range
// no memory can have (address 0 with a nonzero size, or ptr+size past
// 2^64) makes a buffer whose every use fails with an error matching
// cuda.ErrInvalidArgument.
func FromPointer(ptr cuda.DevicePtr, size uint64) *Buffer {
	b := &Buffer{ptr: ptr, size: size}
	w := initBit
	if badRange(ptr, size) {
		w |= badBit
	}
	b.word.Store(w)
	return b
}

// badRange reports a range no memory can have: a null address with a
// size (no allocator hands out address 0), or one that wraps past 2^64.
func badRange(ptr cuda.DevicePtr, size uint64) bool {
	return ptr == 0 && size > 0 || uint64(ptr)+size < uint64(ptr)
}

// Close frees an owned buffer on its allocation stream (or the resource's
// default stream if it had none). Closing a view or a borrowed buffer only
// stops its use; closing an owner ends every view of it, and closing a view
// ends the views sliced from it.
//
// Close waits for the calls in progress on the buffer and its views, so it
// must not be called from inside [Buffer.Use] on the same buffer.
//
// If the memory is held ([Buffer.Hold]: exported to a C library through
// package dlpack, say), Close closes the buffer and returns nil without
// freeing: the last Hold's Release frees the memory, on the stream Close
// would have used.
func (b *Buffer) Close() error { return b.CloseOn(nil) }

// ErrPartlyFreed is wrapped by a MemoryResource's Deallocate error when the
// memory can no longer be used (it was unmapped or handed back) but some of
// the cleanup after that failed. The buffer is then closed anyway: a
// failed Deallocate that does not wrap it leaves the buffer open, so that
// Close can be retried, and that must never happen over memory that is
// gone. The resource keeps what it could not give back (for a retry) and
// says so in the error.
var ErrPartlyFreed = errors.New("memory freed, but cleaning up after it failed")

// CloseOn frees an owned buffer ordered on s instead of the allocation
// stream: use it when the memory was last used on another stream. The
// stream goes to the resource's Deallocate as it is: the resource judges
// it (a failed Deallocate leaves the buffer open).
func (b *Buffer) CloseOn(s *cuda.Stream) error {
	if b == nil {
		return nil
	}
	w := b.word.Load()
	if w&initBit == 0 {
		return nil
	}
	if b.view() != nil {
		b.word.Or(closedBit) // views never free; they only stop being usable
		return nil
	}
	// The common case, an open buffer with no call in progress, takes it
	// at once; beginClose sorts out the others.
	if w&(closingBit|closedBit|readerMask) != 0 || !b.word.CompareAndSwap(w, w|closingBit) {
		if !b.beginClose() {
			return nil // closed already
		}
	}
	e := b.entry(w) // found before the free, which it need not wait for
	if h := b.homeOf(w); h != nil && h.mr != nil && b.ptr != 0 {
		if s == nil {
			s = h.stream
		}
		if b.x.Load() != nil && b.deferFree(s) {
			// Held (exported): the last Release frees, on s.
			b.endClose(true)
			return nil
		}
		if err := h.mr.Deallocate(b.ptr, b.size, s); err != nil {
			err = fmt.Errorf("buffer close (%#x, %d bytes): %w", uint64(b.ptr), b.size, err)
			// Still open unless the memory is gone: the caller may retry
			// (on another stream, say). Memory that is gone must not be
			// used again, whatever the resource failed to tidy up.
			b.endClose(errors.Is(err, ErrPartlyFreed))
			return err
		}
	}
	// endClose(true), inline.
	if e != nil {
		e.meta = 0 // untrack
	}
	if b.word.Add(closedBit-closingBit)&waitersBit != 0 {
		b.wakeClosers()
	}
	return nil
}

// beginClose makes the caller (Close or Disown of root r) the buffer's one
// closer: it sets closingBit, so that new calls fail, then waits for the
// calls in progress. It waits for another closer first. It reports false,
// owning nothing, if the buffer is closed. endClose must follow a true.
func (r *Buffer) beginClose() bool {
	for {
		w := r.word.Load()
		if w&closedBit != 0 {
			return false
		}
		if w&closingBit == 0 {
			if !r.word.CompareAndSwap(w, w|closingBit) {
				continue
			}
			if w&readerMask != 0 {
				r.waitUntil(func(w uint64) bool { return w&readerMask == 0 })
			}
			return true
		}
		// Another Close or Disown is under way: wait for its end, then
		// look again (it may have failed and left the buffer open).
		r.waitUntil(func(w uint64) bool { return w&closingBit == 0 })
	}
}

// endClose ends beginClose: the buffer is closed, or open again, and the
// closers waiting for this one are woken.
func (r *Buffer) endClose(closed bool) {
	d := ^closingBit + 1 // minus closingBit
	if closed {
		d += closedBit
		r.untrack()
	}
	// The caller owns closingBit, so one addition clears it (and sets
	// closedBit); concurrent calls only add and take away readers.
	if r.word.Add(d)&waitersBit != 0 {
		r.wakeClosers()
	}
}

// wakeClosers ends endClose when closers wait: it clears waitersBit
// before waking them, as they set it before sleeping (under the ext's
// lock), so that one that sleeps again sets it again.
func (r *Buffer) wakeClosers() {
	r.word.And(^waitersBit)
	r.wake()
}

// waitUntil blocks until ok(word) holds. It sets waitersBit under the
// ext's lock before sleeping, and whoever changes the word afterwards
// (a release, endClose) sees it and broadcasts under the same lock, so
// no wake-up is lost.
func (r *Buffer) waitUntil(ok func(uint64) bool) {
	x := r.ext()
	x.mu.Lock()
	defer x.mu.Unlock()
	for {
		w := r.word.Load()
		if ok(w) {
			return
		}
		if w&waitersBit == 0 && !r.word.CompareAndSwap(w, w|waitersBit) {
			continue
		}
		x.cond.Wait()
	}
}

func (r *Buffer) wake() {
	x := r.x.Load() // made by the waiter before it set waitersBit
	x.mu.Lock()
	x.cond.Broadcast()
	x.mu.Unlock()
}

// acquire starts a call on the buffer: it fails with cuda.ErrClosed after
// Close, or while a Close is in progress; otherwise release must follow.
// It never waits (see the state word).
func (b *Buffer) acquire(op string) (cuda.DevicePtr, error) {
	if b == nil {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	if b.use() {
		return b.ptr, nil
	}
	switch w := b.rootOf().word.Load(); {
	case w&initBit == 0:
		return 0, zeroErr(op)
	case w&badBit != 0:
		r := b.rootOf()
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "the buffer's range (%#x, %d bytes) is at address 0 or wraps around the address space", uint64(r.ptr), r.size)
	}
	return 0, closedErr(op)
}

// use is acquire's test: it counts a call on b's root and reports true,
// or reports false, counting nothing, if b is zero, bad, closed or being
// closed. A true use must be followed by release.
func (b *Buffer) use() bool {
	r, x := b, b.view()
	if x != nil {
		r = x.root
	}
	if w := r.word.Add(1); w&(initBit|badBit|closingBit|closedBit) != initBit || x != nil && b.viewClosed() {
		r.unuse()
		return false
	}
	return true
}

func (b *Buffer) release() { b.rootOf().unuse() }

// unuse ends a call counted on root r, waking a closer that waits for the
// last one.
func (r *Buffer) unuse() {
	if w := r.word.Add(^uint64(0)); w&waitersBit != 0 {
		r.wake()
	}
}

func closedErr(op string) error { return &cuda.OpError{Op: op, Err: cuda.ErrClosed} }

func zeroErr(op string) error {
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "zero Buffer (buffers come from a MemoryResource, Owned or FromPointer)")
}

// checkStream rejects a zero or closed cuda.Stream (cuda.ResolveStream);
// a nil stream is fine (it means the buffer's own).
func checkStream(op string, s *cuda.Stream) error {
	if s == nil {
		return nil
	}
	_, err := s.Device().ResolveStream(op, s, false)
	return err
}

// viewClosed reports whether b, or a view it was sliced from, was closed.
func (b *Buffer) viewClosed() bool {
	for v := b; ; {
		x := v.view()
		if x == nil {
			return false
		}
		if v.word.Load()&closedBit != 0 {
			return true
		}
		v = x.parent
	}
}

// isZero reports a Buffer no constructor made (nil included).
func (b *Buffer) isZero() bool { return b == nil || b.word.Load()&initBit == 0 }

// IsClosed reports whether the buffer is closed: by its own Close, or for
// a view, by the Close of its owner or of a view it was sliced from. Nil
// and zero Buffers report true.
func (b *Buffer) IsClosed() bool {
	return b.isZero() || b.rootOf().word.Load()&closedBit != 0 || b.viewClosed()
}

// Ptr is the buffer's address (a device address, or a host address for
// host memory under unified addressing), or 0 once closed.
func (b *Buffer) Ptr() cuda.DevicePtr {
	if b.IsClosed() {
		return 0
	}
	return b.ptr
}

// Size is the buffer's size in bytes (it stays readable after Close).
func (b *Buffer) Size() uint64 {
	if b == nil {
		return 0
	}
	return b.size
}

// Resource is the resource that owns the memory, or nil for borrowed
// buffers (and for every buffer once closed).
func (b *Buffer) Resource() MemoryResource {
	if b == nil || !b.use() {
		return nil
	}
	defer b.release()
	return b.resource()
}

// Stream is the stream the buffer was allocated on (nil if none).
func (b *Buffer) Stream() *cuda.Stream {
	if b.isZero() {
		return nil
	}
	return b.allocStream()
}

// IsOwned reports whether Close frees the memory.
func (b *Buffer) IsOwned() bool {
	return !b.isZero() && b.view() == nil && b.word.Load()&ownedBit != 0
}

// String describes the buffer for logs.
func (b *Buffer) String() string {
	switch {
	case b == nil:
		return "Buffer(nil)"
	case b.isZero():
		return "Buffer(zero)"
	case b.IsClosed():
		return fmt.Sprintf("Buffer(closed, %d bytes)", b.size)
	}
	return fmt.Sprintf("Buffer(%#x, %d bytes)", uint64(b.Ptr()), b.size)
}

// Use runs f with the buffer's address while keeping the buffer open:
// Close (and Disown) wait until f returns, so f may hand the address to
// the driver without racing a concurrent Close. Resources and other
// packages use it for driver calls on a buffer (prefetch, export). f may
// use other buffers, and b's other methods, but must not close or disown
// b (that Close would wait for f), nor wait for a goroutine that does.
func (b *Buffer) Use(op string, f func(ptr cuda.DevicePtr) error) error {
	if f == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil function")
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	return f(ptr)
}
