package resource

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Adaptors wrap another resource (the upstream) and add one concern on
// top: a byte cap ([Limiting]), counters ([Statistics]) or a record of
// live allocations ([Tracking]), as RMM's limiting, statistics and
// tracking adaptors do. They are themselves buffer.MemoryResources, so
// they stack: NewTracking(NewStatistics(NewLimiting(pool, n)), nil).
//
// Why an adaptor owns its buffers: a Buffer frees through the resource
// that owns it, so a buffer still owned by the upstream would be closed
// behind the adaptor's back and its books would never come down. The
// Buffer an adaptor returns is therefore owned by the adaptor; its
// Deallocate updates the books and forwards to the upstream.
//
// Only the top of a stack builds that Buffer. Every layer here (the
// adaptors, the SubAllocator, the pools) is a [buffer.RawResource]: its
// AllocatePtr hands out the memory as a bare address, and a layer over
// one asks it for that, adds its books, and passes the address up; the
// top layer's Allocate wraps it once (buffer.Owned). So a stack of any
// depth costs one Buffer per allocation, and each adaptor adds only its
// own bookkeeping (a few atomic operations; a map under a lock for
// Tracking). An upstream that is not a RawResource (the synchronous
// resources, a type from another package) is asked for a Buffer, which
// is taken apart (Buffer.Disown) and its memory passed up the same way;
// that costs one extra Buffer per allocation, nothing next to a
// synchronous driver allocation. The stream the upstream chose (it
// resolves nil to its default) is kept.
//
// Adaptors do not own their upstream: they have no Close, and closing the
// upstream is left to whoever made it. Errors from the upstream are
// returned unchanged (they already name the operation and the sizes), so a
// stack of adaptors does not pile prefixes onto an out-of-memory error.
//
// An allocation at address 0 (what size 0 gives) owns no memory and is
// not counted: Buffer.Close never calls Deallocate for it, so counting it
// would leave it live forever.

var (
	_ buffer.RawResource = (*DevicePool)(nil)
	_ buffer.RawResource = (*PinnedPool)(nil)
	_ buffer.RawResource = (*Limiting)(nil)
	_ buffer.RawResource = (*Statistics)(nil)
	_ buffer.RawResource = (*Tracking)(nil)
	_ buffer.RawResource = (*SubAllocator)(nil)
)

// allocateFrom allocates size bytes from up as a bare address, and the
// stream the memory is ordered on: through AllocatePtr when up offers it,
// else by taking up's Buffer apart. Errors from up are returned unchanged.
func allocateFrom(op string, up buffer.MemoryResource, size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if ru, ok := up.(buffer.RawResource); ok {
		return ru.AllocatePtr(size, s)
	}
	ub, err := up.Allocate(size, s)
	if err != nil {
		return 0, nil, err
	}
	return adaptorTake(op, up, ub, size)
}

// ownedBuffer wraps what an AllocatePtr returned in a Buffer owned by
// owner: what each layer's Allocate does with its own AllocatePtr.
func ownedBuffer(owner buffer.MemoryResource, size uint64, ptr cuda.DevicePtr, s *cuda.Stream, err error) (*buffer.Buffer, error) {
	if err != nil {
		return nil, err
	}
	return buffer.Owned(ptr, size, owner, s), nil
}

// adaptorTake moves the memory of ub, which up returned for a request of
// size bytes, out of ub: the caller wraps it in a Buffer it owns. A nil,
// borrowed or wrongly sized buffer breaks the MemoryResource contract;
// the memory (if any) goes back to the upstream and the error matches
// cuda.ErrInvalidArgument.
func adaptorTake(op string, up buffer.MemoryResource, ub *buffer.Buffer, size uint64) (cuda.DevicePtr, *cuda.Stream, error) {
	if ub == nil {
		return 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "upstream %v returned no buffer and no error for %d bytes", up, size)
	}
	s := ub.Stream()
	ptr, got, err := ub.Disown()
	if err != nil {
		bad := cuda.Errorf(op, cuda.ErrInvalidArgument, "upstream %v returned a buffer it does not own for %d bytes: %v", up, size, err)
		if cerr := ub.Close(); cerr != nil {
			bad = errors.Join(bad, fmt.Errorf("close it: %w", cerr))
		}
		return 0, nil, bad
	}
	if got != size {
		bad := cuda.Errorf(op, cuda.ErrInvalidArgument, "upstream %v returned %d bytes for a request of %d", up, got, size)
		if ptr != 0 {
			if derr := up.Deallocate(ptr, got, s); derr != nil {
				// Still the upstream's memory: owned again, so that the
				// safety net frees it if nothing else can.
				buffer.Owned(ptr, got, up, s)
				bad = errors.Join(bad, fmt.Errorf("give %#x (%d bytes) back: %w", uint64(ptr), got, derr))
			}
		}
		return 0, nil, bad
	}
	return ptr, s, nil
}

// adaptorUpstream is what constructors store: a nil pointer of any type
// counts as no upstream, so that calls report it instead of panicking.
func adaptorUpstream(up buffer.MemoryResource) buffer.MemoryResource {
	if up == nil || isNilPointer(up) {
		return nil
	}
	return up
}

// errNoUpstream is the error for a call on a nil adaptor, a zero value or
// one made over a nil upstream.
func errNoUpstream(kind, op string) error {
	return cuda.Errorf(kind+"."+op, cuda.ErrInvalidArgument, "%s has no upstream resource (create it with New%s over a non-nil resource)", kind, kind)
}

// adaptorString formats an adaptor for logs.
func adaptorString(kind string, up buffer.MemoryResource, detail string) string {
	if up == nil {
		return kind + "(nil)"
	}
	if detail == "" {
		return fmt.Sprintf("%s(%v)", kind, up)
	}
	return fmt.Sprintf("%s(%s, %v)", kind, detail, up)
}

// subSat subtracts n from c without going below zero: a Deallocate the
// adaptor never saw allocate (forwarded all the same) must not wrap the
// counter around.
func subSat(c *atomic.Uint64, n uint64) {
	for {
		old := c.Load()
		nv := uint64(0)
		if old > n {
			nv = old - n
		}
		if c.CompareAndSwap(old, nv) {
			return
		}
	}
}

// addSat adds n to c, stopping at the largest uint64 instead of wrapping
// around: counters fed by sizes from callers (or a misbehaving upstream)
// must not wrap to small values. It returns the new value.
func addSat(c *atomic.Uint64, n uint64) uint64 {
	for {
		old := c.Load()
		nv := old + n
		if nv < old {
			nv = ^uint64(0)
		}
		if c.CompareAndSwap(old, nv) {
			return nv
		}
	}
}

// raiseTo lifts the peak p to at least v. It only loads when p is already
// high enough, the usual case once a workload has warmed up.
func raiseTo(p *atomic.Uint64, v uint64) {
	for {
		old := p.Load()
		if v <= old || p.CompareAndSwap(old, v) {
			return
		}
	}
}
