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
// Adaptors move addresses only: each layer's AllocatePtr asks its
// upstream's AllocatePtr for an address, adds its books, and passes the
// address up; only the top layer's Allocate builds a Buffer
// (buffer.Allocate), so a stack of any depth costs one Buffer per
// allocation, and each adaptor adds only its own bookkeeping (a few atomic
// operations; a map under a lock for Tracking), as RMM's adaptors forward
// a pointer. The stream the upstream chose (it resolves nil to its
// default) is kept.
//
// Adaptors do not own their upstream: they have no Close, and closing the
// upstream is left to whoever made it. Errors from the upstream are
// returned unchanged (they already name the operation and the sizes), so a
// stack of adaptors does not pile prefixes onto an out-of-memory error.
//
// An upstream may be user code, and user code may panic: a panic goes on
// to the caller, and the adaptor's books stay as if the call had failed
// (a Limiting's reservation is given back, a Tracking's or a Fallback's
// record of a free that panicked is kept). No adaptor holds a lock while
// it calls its upstream or a user function.
//
// An allocation at address 0 (what size 0 gives) owns no memory and is
// not counted: Buffer.Close never calls Deallocate for it, so counting it
// would leave it live forever.

// adaptor is the base the adaptors of this package embed: the upstream,
// what every adaptor answers from it, and the free through it. The
// forwarding is said here once: an adaptor's Upstream, DeviceAccessible,
// HostAccessible and DeviceID are one-line calls of these through its
// base(), which is nil for a nil adaptor, and these answer nil, false,
// false and -1 without an upstream. Each adaptor still declares the four
// because a method promoted from an embedded field is not safe on a nil
// pointer (Go dereferences it to reach the field), and every handle of
// this module is.
type adaptor struct{ up buffer.MemoryResource }

func (a *adaptor) upstream() buffer.MemoryResource {
	if a == nil {
		return nil
	}
	return a.up
}

func (a *adaptor) deviceAccessible() bool { return a != nil && a.up != nil && a.up.DeviceAccessible() }
func (a *adaptor) hostAccessible() bool   { return a != nil && a.up != nil && a.up.HostAccessible() }

func (a *adaptor) deviceID() int {
	if a == nil || a.up == nil {
		return -1
	}
	return a.up.DeviceID()
}

// freeThrough frees through up and reports whether the memory is gone, so
// that the caller takes it off its books: on success, and on an error
// wrapping buffer.ErrPartlyFreed (its Buffer closes anyway). A free that
// failed otherwise leaves the memory held, and a retried Close may free
// it.
func freeThrough(up buffer.MemoryResource, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) (gone bool, err error) {
	err = up.Deallocate(ptr, size, s)
	return err == nil || errors.Is(err, buffer.ErrPartlyFreed), err
}

// adaptorUpstream is what constructors store: a nil pointer of any type
// counts as no upstream, so that calls report it instead of panicking.
func adaptorUpstream(up buffer.MemoryResource) buffer.MemoryResource {
	if up == nil || holdsNil(up) {
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
		if nv := satAdd(old, n); c.CompareAndSwap(old, nv) {
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
