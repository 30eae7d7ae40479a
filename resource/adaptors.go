package resource

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// The adaptors (Limiting, Statistics, Tracking, Logging, Retrying,
// Fallback; the package doc says how they stack) share these rules. They
// do not own their upstream (they have no Close), and return its errors
// unchanged: those already name the operation and the sizes. An upstream
// or a hook may be user code and panic: the panic goes on to the caller,
// with the books as if the call had failed. No adaptor holds a lock while
// it calls its upstream or a user function. An allocation at address 0
// (size 0) owns nothing, is never deallocated and is not counted.

// upDeviceAccessible, upHostAccessible and upDeviceID answer for the
// upstream of an adaptor or a SubAllocator (false, false and -1 without
// one), as their DeviceAccessible, HostAccessible and DeviceID do: with
// the nil-safe Upstream, so that these are safe on nil values too.
func upDeviceAccessible(up buffer.MemoryResource) bool { return up != nil && up.DeviceAccessible() }
func upHostAccessible(up buffer.MemoryResource) bool   { return up != nil && up.HostAccessible() }

func upDeviceID(up buffer.MemoryResource) int {
	if up == nil {
		return -1
	}
	return up.DeviceID()
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
