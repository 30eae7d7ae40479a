package resource

import (
	"fmt"
	"sync/atomic"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Limiting caps the bytes live through it: an Allocate that would take
// the total past the limit fails with an error matching
// cuda.ErrorOutOfMemory, without asking the upstream. It is RMM's
// limiting_resource_adaptor, and what PyTorch's
// set_per_process_memory_fraction does: a budget for one component
// sharing a device (or a pool) with others, and a way to test
// out-of-memory paths without filling a GPU.
//
// The cap counts the bytes requested, not what the upstream reserves
// behind them, so it bounds what callers hold. Bytes are reserved with a
// compare-and-swap before the upstream is called and given back if it
// fails, so concurrent callers never overshoot the limit together (a
// request may fail while another that will itself fail holds its
// reservation). Buffers from Allocate are owned by the Limiting, so that
// their Close gives the bytes back. Limiting is safe for concurrent use.
type Limiting struct {
	up    buffer.MemoryResource
	limit uint64
	used  atomic.Uint64
}

var _ buffer.MemoryResource = (*Limiting)(nil)

// NewLimiting returns a resource that allocates from upstream while at
// most limit bytes are live through it. A limit of 0 refuses every
// non-empty allocation. A nil upstream makes every Allocate fail with an
// error matching cuda.ErrInvalidArgument (the constructor returns no
// error, so adaptors can be nested in one expression).
func NewLimiting(upstream buffer.MemoryResource, limit uint64) *Limiting {
	return &Limiting{up: adaptorUpstream(upstream), limit: limit}
}

// Allocate reserves size bytes against the limit and allocates them from
// the upstream on s. Beyond the limit it returns an error matching
// cuda.ErrorOutOfMemory that names the request, the limit and the bytes
// in use; upstream errors are returned unchanged. Size 0 always fits.
func (r *Limiting) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]): the
// address (0 for size 0) and the stream the upstream ordered it on. Free
// it with Deallocate, which gives the bytes back to the budget.
func (r *Limiting) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if r == nil || r.up == nil {
		return 0, nil, errNoUpstream("Limiting", "Allocate")
	}
	if size > 0 {
		for {
			used := r.used.Load() // never above r.limit, so the subtraction cannot wrap
			if size > r.limit-used {
				var err error = fmt.Errorf("%d bytes would exceed the limit of %d bytes (%d in use): %w", size, r.limit, used, cuda.ErrorOutOfMemory)
				if size > r.limit {
					err = neverFits{err} // whatever is freed: no retry can succeed
				}
				return 0, nil, &cuda.OpError{Op: "Limiting.Allocate", Err: err}
			}
			if r.used.CompareAndSwap(used, used+size) {
				break
			}
		}
	}
	// The reservation is given back unless the upstream succeeds: when it
	// fails, and when it panics (it may be user code), or the budget would
	// shrink for good.
	ok := false
	defer func() {
		if !ok && size > 0 {
			subSat(&r.used, size)
		}
	}()
	ptr, us, err := r.up.AllocatePtr(size, s)
	if err == nil && ptr == 0 && size > 0 {
		// No memory to free later (a Buffer at address 0 is never
		// deallocated): the reservation would be lost for good.
		err = cuda.Errorf("Limiting.Allocate", cuda.ErrInvalidArgument, "upstream %v returned address 0 for %d bytes", r.up, size)
	}
	if err != nil {
		return 0, nil, err
	}
	ok = true
	return ptr, us, nil
}

// Deallocate frees through the upstream and, once the upstream succeeded,
// returns size bytes to the budget (never below zero); a failed free
// keeps them counted, as the memory is still held. A zero ptr does
// nothing.
func (r *Limiting) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if r == nil || r.up == nil {
		return errNoUpstream("Limiting", "Deallocate")
	}
	gone, err := freeThrough(r.up, ptr, size, s)
	if gone {
		subSat(&r.used, size)
	}
	return err
}

// Used is the number of bytes live through the resource, including
// reservations of allocations still in progress.
func (r *Limiting) Used() uint64 {
	if r == nil {
		return 0
	}
	return r.used.Load()
}

// Limit is the cap in bytes.
func (r *Limiting) Limit() uint64 {
	if r == nil {
		return 0
	}
	return r.limit
}

// Upstream is the resource r allocates from (nil if none).
func (r *Limiting) Upstream() buffer.MemoryResource {
	if r == nil {
		return nil
	}
	return r.up
}

// DeviceAccessible, HostAccessible and DeviceID answer for the upstream.
func (r *Limiting) DeviceAccessible() bool { return upDeviceAccessible(r.Upstream()) }
func (r *Limiting) HostAccessible() bool   { return upHostAccessible(r.Upstream()) }
func (r *Limiting) DeviceID() int          { return upDeviceID(r.Upstream()) }

// String describes the resource for logs.
func (r *Limiting) String() string {
	if r == nil {
		return "Limiting(nil)"
	}
	return adaptorString("Limiting", r.up, fmt.Sprintf("%d of %d bytes used", r.used.Load(), r.limit))
}
