package buffer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/ownedmem"
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
	if ptr, rs, ok, err := ownedmem.Allocate(mr, size, s); ok {
		// A pool resource's memory, not recorded as a plain pointer: the
		// Buffer is the record (see package ownedmem).
		if err != nil {
			return nil, err
		}
		return owned(ptr, size, mr, rs, unrecordedBit), nil
	}
	ptr, s, err := mr.AllocatePtr(size, s)
	if err != nil {
		return nil, err
	}
	return Owned(ptr, size, mr, s), nil
}

// leaks counts buffers garbage collected without Close; leaksKept counts
// those among them whose memory the safety net did not free.
var leaks, leaksKept atomic.Int64

// Leaks returns how many owned buffers were garbage collected without
// Close. The safety net frees their memory, except for those counted by
// [LeaksKept]. Tests assert it stays 0.
//
// The net watches owned buffers in groups made together (one finalizer
// for many, which keeps it off the allocation fast path), so a lost
// buffer is found, freed and counted only once every buffer of its group
// is unreachable: possibly long after it was lost.
func Leaks() int64 { return leaks.Load() }

// LeaksKept returns how many of the buffers counted by [Leaks] kept their
// memory instead: the safety net never frees memory under a host view
// ([Buffer.Bytes]) that was handed out, because the []byte does not keep
// the Buffer alive and may still be in use; and it gives up when the
// resource refuses to free (on the allocation stream and on the default
// one). That memory stays allocated for the life of the process. A free
// whose error wraps [ErrPartlyFreed] gave the memory back, and is not
// counted here.
func LeaksKept() int64 { return leaksKept.Load() }

// The state word (Buffer.word) of an owner or a borrowed buffer: the
// count of calls in progress in the low bits, then flags. It replaces a
// lock, and costs the hot path (Allocate, Close; acquire and release
// around each call) one atomic operation each.
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
// A view's word holds only initBit, viewBit and closedBit (its own
// Close); calls on a view count on its root's word.
const (
	readerMask = 1<<32 - 1
	closingBit = uint64(1) << 32 // a Close or Disown owns the buffer: calls fail, other closers wait
	closedBit  = uint64(1) << 33 // closed or disowned (views: closed by their own Close)
	waitersBit = uint64(1) << 34 // a closer waits on ext.cond: releases and the end of a Close broadcast
	viewedBit  = uint64(1) << 35 // a host view (Bytes) was handed out: the safety net never frees it
	ownedBit   = uint64(1) << 36 // made with a resource: Close frees through it
	badBit     = uint64(1) << 37 // no use is valid: a null address, or a range past 2^64
	initBit    = uint64(1) << 38 // made by a constructor (the zero Buffer lacks it)
	viewBit    = uint64(1) << 39 // a view (Slice): its ext holds its root and parent
	// unrecordedBit: made by Allocate through package ownedmem, so the
	// memory is freed through it too (the resource keeps no record of the
	// address; Disown makes it one).
	unrecordedBit = uint64(1) << 40
)

// ext is what few buffers need, made on first need so that the common
// owned buffer is one small object: a view's link to the buffer it was
// sliced from; an owner's (or borrowed buffer's) Holds, the closers'
// waiting room, and the driver's description of the memory.
type ext struct {
	// Views: the owner or borrowed buffer whose memory they share, and
	// the buffer they were sliced from. Kept here rather than in the
	// Buffer, which views are few of: the owned Buffer, made on every
	// allocation, is a pointer smaller.
	root, parent *Buffer

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
// An owned Buffer is one 56-byte object (a view or a held buffer adds an
// ext): the fields below, nothing behind pointers.
type Buffer struct {
	word   atomic.Uint64       // see the state word; views: their own closedBit, and viewBit
	ptr    cuda.DevicePtr      // this buffer's address (a view's: its root's plus its offset)
	size   uint64              // this buffer's (or view's) size
	mr     MemoryResource      // the resource that frees it (views: their root's); never changes
	stream *cuda.Stream        // the allocation stream (views: their root's)
	x      atomic.Pointer[ext] // views: set by Slice, before the view is shared; others: made on first need
}

// isView reports whether b was made by Slice.
func (b *Buffer) isView() bool { return b.word.Load()&viewBit != 0 }

// rootOf returns the buffer whose word counts b's calls: b's root for a
// view, b itself otherwise.
func (b *Buffer) rootOf() *Buffer {
	if b.isView() {
		return b.x.Load().root
	}
	return b
}

// off is b's offset in its root's range (0 but for views).
func (b *Buffer) off() uint64 { return uint64(b.ptr - b.rootOf().ptr) }

// Owned wraps memory that mr allocated or mapped: Close will call
// mr.Deallocate(ptr, size, s), on s unless CloseOn names another stream.
// [Allocate] uses it; resources that map memory they did not allocate
// (imports) use it directly. A range no memory
// can have (address 0 with a nonzero size, or ptr+size past 2^64) makes a
// buffer whose every use but Close fails with an error matching
// cuda.ErrInvalidArgument.
func Owned(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream) *Buffer {
	return owned(ptr, size, mr, s, 0)
}

// owned is Owned with extra bits for the state word.
func owned(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream, extra uint64) *Buffer {
	w := initBit | extra
	if badRange(ptr, size) {
		w |= badBit
	}
	var b *Buffer
	if mr == nil || ptr == 0 {
		b = new(Buffer)
	} else {
		b = newTracked()
		w |= inheritViewed(ptr)
	}
	if mr != nil {
		w |= ownedBit
	}
	b.ptr, b.size, b.mr, b.stream = ptr, size, mr, s
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
	if b == nil || b.word.Load()&initBit == 0 {
		return nil
	}
	if b.isView() {
		b.word.Or(closedBit) // views never free; they only stop being usable
		return nil
	}
	if !b.beginClose() {
		return nil // closed already
	}
	// The free runs the resource's code, which may be a user's and may
	// panic: the deferred endClose then leaves the buffer open, so that
	// the panic propagates without wedging every later Close.
	closed := false
	defer func() { b.endClose(closed) }()
	if b.mr != nil && b.ptr != 0 {
		if s == nil {
			s = b.stream
		}
		if deferred, err := b.deferFree(s); err != nil || deferred {
			// Held (exported): the last Release frees, on s; or s is one
			// it could never free on, and the buffer stays open.
			closed = err == nil
			return err
		}
		if err := deallocate(b.mr, b.ptr, b.size, s, b.word.Load()); err != nil {
			// Still open unless the memory is gone: the caller may retry
			// (on another stream, say). Memory that is gone must not be
			// used again, whatever the resource failed to tidy up.
			closed = errors.Is(err, ErrPartlyFreed)
			return fmt.Errorf("buffer close (%#x, %d bytes): %w", uint64(b.ptr), b.size, err)
		}
	}
	closed = true
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
	for {
		w := r.word.Load()
		nw := w &^ (closingBit | waitersBit)
		if closed {
			nw |= closedBit
			// Nothing reads it from now on (every reader is within a
			// call, and none is in progress or can start), and a closed
			// Buffer must not keep its resource reachable: a slab whose
			// closed Buffer holds a SubAllocator holding its block's
			// Buffer in the same slab would reach itself and never be
			// finalized.
			r.mr = nil
		}
		if r.word.CompareAndSwap(w, nw) {
			if w&waitersBit != 0 {
				r.wake()
			}
			return
		}
	}
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
	r := b.rootOf()
	if w := r.word.Add(1); w&(initBit|badBit|closingBit|closedBit) != initBit || r != b && b.viewClosed() {
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
	for v := b; v.isView(); v = v.x.Load().parent {
		if v.word.Load()&closedBit != 0 {
			return true
		}
	}
	return false
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
	return b.mr
}

// Stream is the stream the buffer was allocated on (nil if none).
func (b *Buffer) Stream() *cuda.Stream {
	if b.isZero() {
		return nil
	}
	return b.stream
}

// IsOwned reports whether Close frees the memory.
func (b *Buffer) IsOwned() bool {
	return !b.isZero() && b.word.Load()&(ownedBit|viewBit) == ownedBit
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
