package resource

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Surviving out-of-memory: the caching resources give back what they
// cache and try once more before failing with cuda.ErrorOutOfMemory, as
// PyTorch's caching allocator does (pool_oom.go, suballoc_oom.go). The
// adaptors below go further, at the caller's choice: Retrying asks a
// function what to do, as RMM's failure_callback_resource_adaptor does;
// Fallback takes the memory from a second resource.

// neverFits marks an out-of-memory error for a request that no memory
// given back can satisfy (larger than a SubAllocator's MaxSize, a
// Limiting's limit or the device): the retries on out-of-memory (a trim,
// Retrying's RetryFunc) are not made for it. The message is the wrapped
// error's.
type neverFits struct{ error }

func (e neverFits) Unwrap() error { return e.error }

// isNeverFits reports whether err is marked neverFits.
func isNeverFits(err error) bool {
	var nf neverFits
	return errors.As(err, &nf)
}

// RetryFunc decides whether Retrying tries an allocation again after it
// failed with out-of-memory: size is the request, attempt counts the
// failures so far (1 after the first). It returns true to try again, false
// to fail. It may free memory, trim caches or wait before it returns.
type RetryFunc func(size uint64, attempt int) bool

// Retrying is an adaptor that, when its upstream fails an allocation with
// an error matching cuda.ErrorOutOfMemory, calls a RetryFunc and tries
// again for as long as it returns true (so the RetryFunc bounds the
// retries). Other errors are returned at once, and so is an
// out-of-memory error for a request that can never fit, whatever is freed
// (larger than a SubAllocator's MaxSize or a Limiting's limit below, or
// than the device's memory), without calling the RetryFunc.
//
// The RetryFunc runs on the allocating goroutine with no lock of the
// Retrying held: it may block, and it may call the Retrying and its
// upstream (free memory through them, or allocate). If it panics, the
// panic goes on to the caller of Allocate, and nothing was allocated.
// Buffers from Allocate are owned by the Retrying. It is safe for
// concurrent use if the RetryFunc is.
type Retrying struct {
	up      buffer.MemoryResource
	retry   RetryFunc
	retries atomic.Uint64
}

var _ buffer.MemoryResource = (*Retrying)(nil)

// NewRetrying returns a Retrying over upstream that calls retry on
// out-of-memory. A nil retry never retries (the adaptor then only
// forwards). A nil upstream makes every Allocate fail with an error
// matching cuda.ErrInvalidArgument.
func NewRetrying(upstream buffer.MemoryResource, retry RetryFunc) *Retrying {
	return &Retrying{up: adaptorUpstream(upstream), retry: retry}
}

// Allocate allocates from the upstream, retrying on out-of-memory while
// the RetryFunc says so. The last upstream error is returned unchanged.
func (r *Retrying) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]).
func (r *Retrying) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if r == nil || r.up == nil {
		return 0, nil, errNoUpstream("Retrying", "Allocate")
	}
	for attempt := 1; ; attempt++ {
		ptr, us, err := r.up.AllocatePtr(size, s)
		if err == nil || r.retry == nil || !errors.Is(err, cuda.ErrorOutOfMemory) || isNeverFits(err) || !r.retry(size, attempt) {
			return ptr, us, err
		}
		r.retries.Add(1)
	}
}

// Deallocate frees through the upstream.
func (r *Retrying) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if r == nil || r.up == nil {
		return errNoUpstream("Retrying", "Deallocate")
	}
	return r.up.Deallocate(ptr, size, s)
}

// Retries is how many times an allocation was tried again.
func (r *Retrying) Retries() uint64 {
	if r == nil {
		return 0
	}
	return r.retries.Load()
}

// Upstream is the resource r allocates from (nil if none).
func (r *Retrying) Upstream() buffer.MemoryResource {
	if r == nil {
		return nil
	}
	return r.up
}

// DeviceAccessible, HostAccessible and DeviceID answer for the upstream.
func (r *Retrying) DeviceAccessible() bool { return upDeviceAccessible(r.Upstream()) }
func (r *Retrying) HostAccessible() bool   { return upHostAccessible(r.Upstream()) }
func (r *Retrying) DeviceID() int          { return upDeviceID(r.Upstream()) }

// String describes the resource for logs.
func (r *Retrying) String() string {
	if r == nil {
		return "Retrying(nil)"
	}
	return adaptorString("Retrying", r.up, fmt.Sprintf("%d retries", r.Retries()))
}

// Fallback is an adaptor that allocates from a primary resource and, when
// that fails with an error matching cuda.ErrorOutOfMemory, from a
// fallback resource: device memory first, managed memory (which the
// driver can page out to the host) when the device is full. Other errors
// of the primary are returned at once; if the fallback fails too, its
// error is returned joined with the primary's. Deallocate sends each
// address back to the resource that made it (the Fallback remembers the
// fallback's addresses: a primary's free costs one map lookup).
//
// The Fallback is DeviceAccessible (HostAccessible) only if both
// resources are, and its DeviceID is the primary's. Buffers from Allocate
// are owned by the Fallback. It is safe for concurrent use.
type Fallback struct {
	up  buffer.MemoryResource // the primary
	alt buffer.MemoryResource

	mu   sync.Mutex
	fell map[cuda.DevicePtr]uint64 // addresses from alt, with their sizes
	n    atomic.Uint64
}

var _ buffer.MemoryResource = (*Fallback)(nil)

// NewFallback returns a Fallback allocating from primary, and from
// fallback when primary is out of memory. With a nil fallback it only
// forwards; a nil primary makes every Allocate fail with an error
// matching cuda.ErrInvalidArgument.
func NewFallback(primary, fallback buffer.MemoryResource) *Fallback {
	return &Fallback{up: adaptorUpstream(primary), alt: adaptorUpstream(fallback), fell: make(map[cuda.DevicePtr]uint64)}
}

// Allocate allocates from the primary, or from the fallback when the
// primary is out of memory.
func (f *Fallback) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(f, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]).
func (f *Fallback) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if f == nil || f.up == nil || f.fell == nil {
		return 0, nil, errNoUpstream("Fallback", "Allocate")
	}
	ptr, us, err := f.up.AllocatePtr(size, s)
	if err == nil || f.alt == nil || !errors.Is(err, cuda.ErrorOutOfMemory) {
		return ptr, us, err
	}
	aptr, aus, aerr := f.alt.AllocatePtr(size, s)
	if aerr != nil {
		return 0, nil, &cuda.OpError{Op: "Fallback.Allocate", Err: fmt.Errorf("%d bytes: primary %v: %w; fallback %v: %w", size, f.up, err, f.alt, aerr)}
	}
	if aptr != 0 {
		f.mu.Lock()
		f.fell[aptr] = size
		f.mu.Unlock()
		f.n.Add(1)
	}
	return aptr, aus, nil
}

// Deallocate frees through the resource that made ptr. If that fails,
// the address stays with it (a retried free goes to the same resource).
func (f *Fallback) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if f == nil || f.up == nil || f.fell == nil {
		return errNoUpstream("Fallback", "Deallocate")
	}
	f.mu.Lock()
	_, alt := f.fell[ptr]
	if alt {
		// Forgotten before the free, so that the fallback handing the
		// address out again (to a racing Allocate) is not undone here.
		delete(f.fell, ptr)
	}
	f.mu.Unlock()
	if !alt {
		return f.up.Deallocate(ptr, size, s)
	}
	// Not freed (the fallback failed, or panicked): the address stays
	// the fallback's, so that a retried free goes there again.
	freed := false
	defer func() {
		if !freed {
			f.mu.Lock()
			f.fell[ptr] = size
			f.mu.Unlock()
		}
	}()
	freed, err := freeThrough(f.alt, ptr, size, s)
	return err
}

// Fallbacks is how many allocations came from the fallback.
func (f *Fallback) Fallbacks() uint64 {
	if f == nil {
		return 0
	}
	return f.n.Load()
}

// LiveFallbacks is how many allocations from the fallback are live.
func (f *Fallback) LiveFallbacks() int {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.fell)
}

// Upstream is the primary resource (nil if none).
func (f *Fallback) Upstream() buffer.MemoryResource {
	if f == nil {
		return nil
	}
	return f.up
}

// Secondary is the fallback resource (nil if none).
func (f *Fallback) Secondary() buffer.MemoryResource {
	if f == nil {
		return nil
	}
	return f.alt
}

// DeviceAccessible reports whether both resources' memory is usable by
// kernels (the primary's answer without a fallback).
func (f *Fallback) DeviceAccessible() bool {
	return upDeviceAccessible(f.Upstream()) && (f.alt == nil || f.alt.DeviceAccessible())
}

// HostAccessible reports whether both resources' memory is usable by the
// CPU (the primary's answer without a fallback).
func (f *Fallback) HostAccessible() bool {
	return upHostAccessible(f.Upstream()) && (f.alt == nil || f.alt.HostAccessible())
}

// DeviceID is the primary's device (-1 without one).
func (f *Fallback) DeviceID() int { return upDeviceID(f.Upstream()) }

// String describes the resource for logs.
func (f *Fallback) String() string {
	if f == nil || f.up == nil {
		return "Fallback(nil)"
	}
	return fmt.Sprintf("Fallback(%d from %v, %v)", f.Fallbacks(), f.alt, f.up)
}
