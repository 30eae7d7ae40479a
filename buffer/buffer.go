package buffer

import (
	"errors"
	"fmt"
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
	return Owned(ptr, size, mr, s), nil
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

// state is an allocation's shared state: the owner Buffer embeds it, and
// its views point to it.
//
// The lock never makes a call wait for another call. Calls take it with
// TryRLock, which fails only while a Close (or Disown) holds or waits for
// the write lock, and then report the buffer closed. So a call that holds
// one buffer and takes another (a copy, a Use whose function touches
// other buffers) never waits behind a pending Close, and no order among
// buffers is needed: a blocked writer cannot stop new readers into a
// cycle. Only Close and Disown wait, and only for calls in progress.
type state struct {
	mu     sync.RWMutex
	closed atomic.Bool // set under mu once closed or disowned; read anywhere
	ptr    cuda.DevicePtr
	size   uint64
	mr     MemoryResource
	stream *cuda.Stream
	track  *tracked // the safety net's record, for owned buffers
	bad    bool     // no use is valid: a null address, or a range past 2^64

	// holds counts the live Holds (the low bits) and has heldFree set
	// once a Close found holds and left the free to the last Release;
	// freeStream is then the stream that Close would have freed on. See
	// hold.go.
	holds      atomic.Uint64
	freeStream *cuda.Stream

	// The driver's description of the allocation (cuPointerGetAttribute),
	// asked when needed and kept once answered: for borrowed buffers' accessors, and to tell
	// pinned from managed memory in host copies. Allocated lazily, so the
	// common owned buffer costs one allocation.
	info atomic.Pointer[pointerInfo]
}

type pointerInfo struct {
	info cuda.PointerInfo
}

// pointerInfo returns the driver's description of the allocation. Racing
// first calls may both ask the driver; the answers are the same. Only an
// answer is kept: a failed query (no driver yet, memory the driver does
// not know, a transient error) is asked again next time, so that one
// failure does not decide the buffer's accessibility for good.
func (st *state) pointerInfo() (cuda.PointerInfo, error) {
	if pi := st.info.Load(); pi != nil {
		return pi.info, nil
	}
	info, err := cuda.QueryPointer(st.ptr)
	if err != nil {
		return cuda.PointerInfo{}, err
	}
	st.info.Store(&pointerInfo{info: info})
	return info, nil
}

// Buffer is a range of memory: device, pinned host, managed, or anything a
// MemoryResource hands out. An owned Buffer (made by a resource, or by
// Owned) frees its memory through the resource on Close; a borrowed one
// (FromPointer) never frees. Views (Slice) share their parent's memory and
// lifetime.
//
// Any use after Close returns an error matching cuda.ErrClosed. Close is
// idempotent. A Buffer lost without Close is freed by a cleanup when
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
	st      *state      // &own for an owner; the owner's state for views
	off     uint64      // offset into the parent's range, for views
	size    uint64      // this buffer's (or view's) size
	parent  *Buffer     // non-nil for views: keeps the owner alive
	vclosed atomic.Bool // a view's own Close (owners use st.closed)
	own     state
}

// Owned wraps memory that mr allocated or mapped: Close will call
// mr.Deallocate(ptr, size, s), on s unless CloseOn names another stream.
// [Allocate] uses it; resources that map memory they did not allocate
// (imports) use it directly. A range no memory
// can have (address 0 with a nonzero size, or ptr+size past 2^64) makes a
// buffer whose every use but Close fails with an error matching
// cuda.ErrInvalidArgument.
func Owned(ptr cuda.DevicePtr, size uint64, mr MemoryResource, s *cuda.Stream) *Buffer {
	if mr == nil || ptr == 0 {
		b := &Buffer{size: size, own: state{ptr: ptr, size: size, mr: mr, stream: s}}
		b.own.bad = badRange(ptr, size)
		b.st = &b.own
		return b
	}
	b, t := newTracked()
	b.size, b.own = size, state{ptr: ptr, size: size, mr: mr, stream: s, track: t, bad: badRange(ptr, size)}
	b.st = &b.own
	t.track(ptr, size, mr, s)
	return b
}

// FromPointer wraps memory owned elsewhere (another library, a kernel's
// output, an imported mapping). The Buffer never frees it; Close only stops
// further use. Accessibility and device are asked of the driver. A range
// no memory can have (address 0 with a nonzero size, or ptr+size past
// 2^64) makes a buffer whose every use fails with an error matching
// cuda.ErrInvalidArgument.
func FromPointer(ptr cuda.DevicePtr, size uint64) *Buffer {
	b := &Buffer{size: size, own: state{ptr: ptr, size: size, bad: badRange(ptr, size)}}
	b.st = &b.own
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
	if b == nil || b.st == nil {
		return nil
	}
	if b.parent != nil {
		b.vclosed.Store(true) // views never free; they only stop being usable
		return nil
	}
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed.Load() {
		return nil
	}
	if st.mr != nil && st.ptr != 0 {
		if s == nil {
			s = st.stream
		}
		if st.deferFree(s) {
			// Held (exported): the last Release frees, on s.
			st.closed.Store(true)
			st.track.stop()
			return nil
		}
		if err := st.mr.Deallocate(st.ptr, st.size, s); err != nil {
			err = fmt.Errorf("buffer close (%#x, %d bytes): %w", uint64(st.ptr), st.size, err)
			if !errors.Is(err, ErrPartlyFreed) {
				// Still open: the caller may retry (on another stream, say).
				return err
			}
			// The memory is gone: the buffer must not be used again,
			// whatever the resource failed to tidy up.
			st.closed.Store(true)
			st.track.stop()
			return err
		}
	}
	st.closed.Store(true)
	st.track.stop()
	return nil
}

// acquire starts a call on the buffer: it fails with cuda.ErrClosed after
// Close, or while a Close is in progress; otherwise release must follow.
// It never waits (see state).
func (b *Buffer) acquire(op string) (cuda.DevicePtr, error) {
	if b == nil {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	st := b.st
	if st == nil {
		return 0, zeroErr(op)
	}
	if st.bad {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "the buffer's range (%#x, %d bytes) is at address 0 or wraps around the address space", uint64(st.ptr), st.size)
	}
	if !st.mu.TryRLock() {
		return 0, closedErr(op) // a Close holds or waits for the lock
	}
	if st.closed.Load() || b.viewClosed() {
		st.mu.RUnlock()
		return 0, closedErr(op)
	}
	return st.ptr + cuda.DevicePtr(b.off), nil
}

func (b *Buffer) release() { b.st.mu.RUnlock() }

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
	for v := b; v.parent != nil; v = v.parent {
		if v.vclosed.Load() {
			return true
		}
	}
	return false
}

// IsClosed reports whether the buffer is closed: by its own Close, or for
// a view, by the Close of its owner or of a view it was sliced from. Nil
// and zero Buffers report true.
func (b *Buffer) IsClosed() bool {
	return b == nil || b.st == nil || b.st.closed.Load() || b.viewClosed()
}

// Ptr is the buffer's address (a device address, or a host address for
// host memory under unified addressing), or 0 once closed.
func (b *Buffer) Ptr() cuda.DevicePtr {
	if b.IsClosed() {
		return 0
	}
	return b.st.ptr + cuda.DevicePtr(b.off)
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
	if b.IsClosed() {
		return nil
	}
	return b.st.mr
}

// Stream is the stream the buffer was allocated on (nil if none).
func (b *Buffer) Stream() *cuda.Stream {
	if b == nil || b.st == nil {
		return nil
	}
	return b.st.stream
}

// IsOwned reports whether Close frees the memory.
func (b *Buffer) IsOwned() bool { return b != nil && b.st != nil && b.parent == nil && b.st.mr != nil }

// String describes the buffer for logs.
func (b *Buffer) String() string {
	switch {
	case b == nil:
		return "Buffer(nil)"
	case b.st == nil:
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
