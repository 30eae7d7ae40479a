package buffer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/asleep"
)

// MemoryResource hands out and takes back memory, as addresses: the
// interface resources implement and compose through (package resource's
// pools, adaptors and sub-allocator; any type with these methods).
// Buffers are built in one place, [Allocate]; adaptors forward addresses
// only.
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

// recordingResource is a resource that records every address it hands out
// so that Deallocate can refuse any other (package resource's pools). A
// Buffer is the record of its memory already, so Allocate takes memory
// from ForBuffers' resource, which skips the record, and Disown hands the
// address back to the record (Record).
type recordingResource interface {
	ForBuffers() MemoryResource
}

// recorder is ForBuffers' resource as Disown sees it.
type recorder interface {
	Record(ptr cuda.DevicePtr, size uint64)
}

// Allocate returns a new Buffer of exactly size bytes from mr, owned by mr
// (its Close calls mr.Deallocate): the one place Buffers are built from a
// resource. Size 0 is allowed and returns an empty buffer. Errors from mr
// are returned unchanged (they name the operation and the sizes).
func Allocate(mr MemoryResource, size uint64, s *cuda.Stream) (*Buffer, error) {
	if mr == nil {
		return nil, cuda.Errorf("buffer.Allocate", cuda.ErrInvalidArgument, "nil MemoryResource")
	}
	free := mr
	if r, ok := mr.(recordingResource); ok {
		if f := r.ForBuffers(); f != nil {
			free = f
		}
	}
	ptr, s, err := free.AllocatePtr(size, s)
	if err != nil {
		return nil, err
	}
	if err := asleep.Check(uint64(ptr), size); err != nil && ptr != 0 {
		// A sub-allocator carved the range out of a block that is asleep
		// (virtual.Resource.Sleep): hand it back rather than make a buffer
		// no call can use.
		if ferr := free.Deallocate(ptr, size, s); ferr != nil {
			err = errors.Join(err, fmt.Errorf("handing the range back: %w", ferr))
		}
		return nil, &cuda.OpError{Op: "buffer.Allocate", Err: err}
	}
	return owned(ptr, size, mr, free, s), nil
}

// Owned wraps memory that mr allocated or mapped: Close will call
// mr.Deallocate(ptr, size, s), on s unless CloseOn names another stream.
// Resources that map memory they did not allocate (imports) use it. A
// range no memory can have makes a buffer whose every use but Close fails,
// as for [FromPointer].
func Owned(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream) *Buffer {
	if mr == nil {
		b := FromPointer(ptr, size)
		b.home = &home{stream: s}
		return b
	}
	return owned(ptr, size, mr, mr, s)
}

func owned(ptr cuda.DevicePtr, size uint64, mr, free MemoryResource, s *cuda.Stream) *Buffer {
	w := initBit | ownedBit | badBits(ptr, size)
	if ptr != 0 && disownedViews.n.Load() > 0 {
		w |= disownedViews.take(ptr)
	}
	b := carve(mr, free, s)
	b.ptr, b.size = ptr, size
	// A plain store: nothing else can see the Buffer yet, and an atomic
	// one would cost the pair a full barrier.
	*(*uint64)(unsafe.Pointer(&b.word)) = w
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
	b.word.Store(initBit | badBits(ptr, size))
	return b
}

// badBits is badBit for a range no memory can have: a null address with a
// size (no allocator hands out address 0), or one that wraps past 2^64.
func badBits(ptr cuda.DevicePtr, size uint64) uint64 {
	if ptr == 0 && size > 0 || uint64(ptr)+size < uint64(ptr) {
		return badBit
	}
	return 0
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
type Buffer struct {
	// word is the lifecycle (see the state word): a cuda.Guard would triple
	// the Buffer and cost a pair more. Views hold only initBit, viewBit and
	// their own closedBit in it.
	word atomic.Uint64
	ptr  cuda.DevicePtr // this buffer's address (a view's: its root's plus its offset)
	size uint64         // this buffer's (or view's) size
	// home is an owner's resources and stream, read only within a call
	// (or by the closer); nil for views, borrowed buffers, and once closed.
	home *home
	ext  atomic.Pointer[ext] // views: set by Slice, before the view is shared; others: made on first need
}

// home is what an owner's Close needs besides its range: the resource that
// owns the memory, the one that frees it (they differ for a
// recordingResource), and the allocation stream. It never changes, so
// each P's cursor shares one among the Buffers it makes (leaks.go).
type home struct {
	mr, free MemoryResource
	stream   *cuda.Stream
}

// The state word: the count of calls in progress in the low bits, then
// flags. acquire adds one to the count and fails (undoing the add) while a
// Close or Disown holds closingBit or after closedBit, so a call never
// waits for another: a call that holds one buffer and takes another (a
// copy, a Use whose function touches other buffers) never waits behind a
// pending Close, and no order among buffers is needed. Only closers wait:
// for the calls in progress, and for another closer of the same buffer, on
// the ext's condition variable, with waitersBit set so that whoever lets
// them go wakes them.
const (
	readerMask = 1<<32 - 1
	closingBit = uint64(1) << 32 // a Close or Disown owns the buffer: calls fail, other closers wait
	closedBit  = uint64(1) << 33 // closed or disowned (views: closed by their own Close)
	waitersBit = uint64(1) << 34 // a closer waits on ext.cond
	viewedBit  = uint64(1) << 35 // a host view (Bytes) was handed out: the safety net never frees it
	ownedBit   = uint64(1) << 36 // made with a resource: Close frees through it
	badBit     = uint64(1) << 37 // no use is valid: a null address, or a range past 2^64
	initBit    = uint64(1) << 38 // made by a constructor (the zero Buffer lacks it)
	viewBit    = uint64(1) << 39 // a view (Slice): its ext holds its root and parent
)

// ext is what few buffers need, made on first need so that the common
// owned buffer is one small object.
type ext struct {
	root, parent *Buffer // views: the owner or borrowed buffer, and the buffer sliced from

	mu   sync.Mutex // with cond: closers wait here (see the state word)
	cond sync.Cond

	// holds counts the live Holds, plus heldFree once a Close left the
	// free (on freeStream, through freeBy) to the last Release (hold.go).
	holds      atomic.Uint64
	freeBy     MemoryResource
	freeStream *cuda.Stream

	info atomic.Pointer[cuda.PointerInfo]
}

// makeExt returns b's ext, making it on first need.
func (b *Buffer) makeExt() *ext {
	if x := b.ext.Load(); x != nil {
		return x
	}
	x := new(ext)
	x.cond.L = &x.mu
	if b.ext.CompareAndSwap(nil, x) {
		return x
	}
	return b.ext.Load()
}

func (b *Buffer) isView() bool { return b.word.Load()&viewBit != 0 }

// rootOf returns the buffer whose word counts b's calls: b's root for a
// view, b itself otherwise.
func (b *Buffer) rootOf() *Buffer {
	if b.isView() {
		return b.ext.Load().root
	}
	return b
}

// off is b's offset in its root's range (0 but for views).
func (b *Buffer) off() uint64 { return uint64(b.ptr - b.rootOf().ptr) }

// homeOf is the root's home, within a call (zero for borrowed memory).
func (b *Buffer) homeOf() home {
	if h := b.rootOf().home; h != nil {
		return *h
	}
	return home{}
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
// the cleanup after that failed. The buffer is then closed anyway, where a
// failed Deallocate that does not wrap it leaves the buffer open for a
// retry. The resource keeps what it could not give back and says so in the
// error.
var ErrPartlyFreed = errors.New("memory freed, but cleaning up after it failed")

// CloseOn frees an owned buffer ordered on s instead of the allocation
// stream: use it when the memory was last used on another stream. The
// resource judges s (a failed Deallocate leaves the buffer open).
func (b *Buffer) CloseOn(s *cuda.Stream) error {
	if b == nil {
		return nil
	}
	w := b.word.Load()
	if w&(initBit|viewBit) != initBit {
		if w&viewBit != 0 {
			b.word.Or(closedBit) // views never free; they only stop being usable
		}
		return nil
	}
	if !b.beginClose(w) {
		return nil // closed already
	}
	h := b.home
	if h == nil || h.free == nil || b.ptr == 0 {
		b.endClose(true) // borrowed, or nothing to free
		return nil
	}
	if s == nil {
		s = h.stream
	}
	if x := b.ext.Load(); x != nil {
		if deferred, err := b.deferFree(x, h, s); err != nil || deferred {
			b.endClose(err == nil)
			return err
		}
	}
	// The resource's code may panic: the buffer then stays open, and the
	// panic propagates without wedging every later Close.
	done := false
	defer func() {
		if !done {
			b.endClose(false)
		}
	}()
	err := h.free.Deallocate(b.ptr, b.size, s)
	done = err == nil || errors.Is(err, ErrPartlyFreed)
	if done {
		b.endClose(true)
	}
	if err != nil {
		return fmt.Errorf("buffer close (%#x, %d bytes): %w", uint64(b.ptr), b.size, err)
	}
	return nil
}

// beginClose makes the caller (Close or Disown of root r, whose word was
// w) the one closer: after any other closer, it sets closingBit, so that
// new calls fail, then waits for the calls in progress. It reports false
// if the buffer is closed; endClose must follow a true.
func (r *Buffer) beginClose(w uint64) bool {
	if w&(closingBit|closedBit|readerMask) == 0 && r.word.CompareAndSwap(w, w|closingBit) {
		return true // the common case: no call, no other closer
	}
	for {
		w := r.word.Load()
		switch {
		case w&closedBit != 0:
			return false
		case w&closingBit != 0:
			// Another closer may fail and leave the buffer open: look again.
			r.waitUntil(func(w uint64) bool { return w&closingBit == 0 })
		case r.word.CompareAndSwap(w, w|closingBit):
			r.waitUntil(func(w uint64) bool { return w&readerMask == 0 })
			return true
		}
	}
}

// endClose ends beginClose: the buffer is closed (its home gone), or open
// again, and the closers waiting for this one are woken.
func (r *Buffer) endClose(closed bool) {
	var w uint64
	if closed {
		r.home = nil
		w = r.word.Add(closedBit - closingBit) // closing becomes closed
		if w&waitersBit != 0 {
			r.word.And(^waitersBit)
		}
	} else {
		for w = r.word.Load(); !r.word.CompareAndSwap(w, w&^(closingBit|waitersBit)); {
			w = r.word.Load()
		}
	}
	if w&waitersBit != 0 {
		r.wake()
	}
}

// waitUntil blocks until ok(word) holds. It sets waitersBit under the
// ext's lock before sleeping, and whoever changes the word afterwards
// broadcasts under the same lock, so no wake-up is lost.
func (r *Buffer) waitUntil(ok func(uint64) bool) {
	x := r.makeExt()
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
	x := r.ext.Load() // made by the waiter before it set waitersBit
	x.mu.Lock()
	x.cond.Broadcast()
	x.mu.Unlock()
}

// Disown hands an owned buffer's memory to the caller: the buffer becomes
// closed without freeing anything, and the safety net is stopped.
// Resources use it to move memory into a new Buffer, as when a
// virtual-memory allocation grows. Views, borrowed buffers and buffers
// with live Holds ([Buffer.Hold]) cannot be disowned. If a host view
// ([Buffer.Bytes]) of the memory was handed out, the next buffer Owned at
// the same address inherits that, so its safety net will not free under
// the view either.
func (b *Buffer) Disown() (ptr cuda.DevicePtr, size uint64, err error) {
	const op = "Buffer.Disown"
	switch {
	case b == nil:
		return 0, 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	case b.isZero():
		return 0, 0, zeroErr(op)
	case !b.IsOwned():
		return 0, 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %#x (%d bytes) is a view or borrowed", uint64(b.ptr), b.size)
	case !b.beginClose(b.word.Load()):
		return 0, 0, closedErr(op)
	}
	if n := b.holds(); n > 0 {
		// Moving the memory on (a remap) would pull it from under them.
		b.endClose(false)
		return 0, 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %#x (%d bytes) is held by %d Hold(s) (an export, such as DLPack's): release them first", uint64(b.ptr), b.size, n)
	}
	if b.ptr != 0 {
		if b.word.Load()&viewedBit != 0 {
			disownedViews.add(b.ptr)
		}
		if h := b.home; !sameResource(h.free, h.mr) {
			if r, ok := h.free.(recorder); ok {
				r.Record(b.ptr, b.size)
			}
		}
	}
	b.endClose(true)
	return b.ptr, b.size, nil
}

// acquire starts a call on the buffer, never waiting: it fails with
// cuda.ErrClosed after Close, or while a Close is in progress; otherwise
// release must follow.
func (b *Buffer) acquire(op string) (cuda.DevicePtr, error) {
	if b == nil {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	if b.use() {
		// Memory put to sleep (virtual.Resource.Sleep) keeps its addresses
		// but has no physical memory behind them: refuse, naming the tag,
		// rather than let the GPU fault. One atomic load while nothing
		// sleeps.
		if err := asleep.Check(uint64(b.ptr), b.size); err != nil {
			b.release()
			return 0, &cuda.OpError{Op: op, Err: err}
		}
		return b.ptr, nil
	}
	if err := b.invalid(op); err != nil {
		return 0, err
	}
	return 0, closedErr(op)
}

// invalid is the error for a zero or bad Buffer, nil for others.
func (b *Buffer) invalid(op string) error {
	switch r := b.rootOf(); {
	case r.word.Load()&initBit == 0:
		return zeroErr(op)
	case r.word.Load()&badBit != 0:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "the buffer's range (%#x, %d bytes) is at address 0 or wraps around the address space", uint64(r.ptr), r.size)
	}
	return nil
}

// use counts a call on b's root, or reports false, counting nothing, if
// b is zero, bad, closed or being closed.
func (b *Buffer) use() bool {
	r := b.rootOf()
	if w := r.word.Add(1); w&(initBit|badBit|closingBit|closedBit) != initBit || r != b && b.viewClosed() {
		r.unuse()
		return false
	}
	return true
}

func (b *Buffer) release() { b.rootOf().unuse() }

// unuse ends a call counted on root r, waking a waiting closer.
func (r *Buffer) unuse() {
	if w := r.word.Add(^uint64(0)); w&waitersBit != 0 {
		r.wake()
	}
}

func closedErr(op string) error { return &cuda.OpError{Op: op, Err: cuda.ErrClosed} }

func zeroErr(op string) error {
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "zero Buffer (buffers come from a MemoryResource, Owned or FromPointer)")
}

// checkStream rejects a zero or closed cuda.Stream; nil is fine.
func checkStream(op string, s *cuda.Stream) error {
	if s == nil {
		return nil
	}
	_, err := s.Device().ResolveStream(op, s, false)
	return err
}

// viewClosed reports whether b, or a view it was sliced from, was closed.
func (b *Buffer) viewClosed() bool {
	for v := b; v.isView(); v = v.ext.Load().parent {
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
func (b *Buffer) Resource() MemoryResource { return b.openHome().mr }

// Stream is the stream the buffer was allocated on, or nil if none (for
// borrowed buffers, and for every buffer once closed).
func (b *Buffer) Stream() *cuda.Stream { return b.openHome().stream }

func (b *Buffer) openHome() home {
	if b == nil || !b.use() {
		return home{}
	}
	defer b.release()
	return b.homeOf()
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
// the driver or foreign code without racing a concurrent Close. f may use
// other buffers, and b's other methods, but must not close or disown b
// (that Close would wait for f), nor wait for a goroutine that does.
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
