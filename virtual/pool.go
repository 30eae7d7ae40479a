package virtual

import (
	"sync"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// DefaultPoolKeepFree is the free memory a pool keeps mapped when
// PoolOptions.Release is nil: enough that a steady mix of small
// allocations does not map and unmap a chunk at each turn.
const DefaultPoolKeepFree = 16 << 20

// PoolOptions configure NewPool. Nil options, or the zero value, give
// chunks with New's defaults, DefaultPoolKeepFree, no cap and no hooks.
type PoolOptions struct {
	// Memory are the properties of the physical chunks, as for New (nil:
	// New's defaults). Reserve and AddrHint are refused: the pool decides
	// the address ranges; so is Segments: the pool's hooks are Segments
	// below.
	Memory *Options
	// Release says how much free memory stays mapped (nil: KeepFree
	// DefaultPoolKeepFree); &resource.ReleasePolicy{} keeps none.
	Release *resource.ReleasePolicy
	// MaxSize caps the mapped bytes; 0 means no cap.
	MaxSize uint64
	// Segments sees every block mapped and unmapped, so that NCCL (or any
	// library that registers memory) registers blocks, not allocations.
	Segments *resource.SegmentHooks
}

// NewPool returns a memory resource whose physical memory follows its
// live memory: a resource.SubAllocator over a Resource of dev, in blocks
// of one chunk (the granularity) for requests up to a chunk and of the
// request's own size, rounded up to chunks, for larger ones. A block is
// mapped when an allocation needs it and unmapped, its physical memory
// released, as soon as its last allocation is freed (after the work
// queued on the streams that freed into it) unless the release policy
// keeps it. No block outlives its allocations to be fragmented, so the
// memory mapped stays within the live allocations rounded up to chunks,
// plus what the policy keeps free: what PyTorch's expandable segments
// aim at, without a cache to empty.
//
// Allocations are stream-ordered as the SubAllocator's are; mapping is
// not, so allocating on a capturing stream is refused (cuda.ErrCapturing)
// rather than captured. Its buffers cannot be exported to another
// process: export a Resource's allocation, or a pool's (ipc.ExportPool).
// Close the SubAllocator when done; the Resource needs no closing.
//
// # Sleep and wake
//
// The pool's blocks are allocations of its Resource (the SubAllocator's
// Upstream, a *Resource), in the tag Memory.Tag: Sleep and Wake on it
// put the whole pool to sleep and wake it, every address kept. While it
// sleeps, allocations the pool would carve out of a sleeping block are
// refused (ErrAsleep) and new blocks are mapped awake; Segments sees each
// block go at Sleep and come back at Wake, once, as for NCCL
// registrations.
//
// Bad options are errors matching cuda.ErrInvalidArgument that name them;
// a device without virtual memory management gives New's error.
func NewPool(dev *cuda.Device, opts *PoolOptions) (*resource.SubAllocator, error) {
	const op = "virtual.NewPool"
	var o PoolOptions
	if opts != nil {
		o = *opts
	}
	if o.Memory != nil && (o.Memory.Reserve != 0 || o.Memory.AddrHint != 0) {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "Memory.Reserve %d and Memory.AddrHint %#x must be 0: the pool places its blocks", o.Memory.Reserve, uint64(o.Memory.AddrHint))
	}
	if o.Memory != nil && o.Memory.Segments != nil {
		// The blocks' Segments hooks are the pool's own (PoolOptions.Segments).
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "Memory.Segments must be nil: a pool's hooks are PoolOptions.Segments, which see each block once")
	}
	var mo Options
	if o.Memory != nil {
		mo = *o.Memory
	}
	blockHooks, sleepHooks := poolHooks(o.Segments)
	mo.Segments = sleepHooks
	r, err := New(dev, &mo)
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	keep := o.Release
	if keep == nil {
		keep = &resource.ReleasePolicy{KeepFree: DefaultPoolKeepFree}
	}
	return resource.NewSubAllocator(r, &resource.SubAllocatorOptions{
		GrowSize: r.Granularity(),
		MaxSize:  o.MaxSize,
		Segments: blockHooks,
		Release:  keep,
	})
}

// poolHooks splits a pool's segment hooks between its SubAllocator (the
// blocks it maps and gives back) and its Resource (the blocks Sleep and
// Wake unmap and map again), so that each hook runs once per change: a
// block that went to sleep was Released already, and giving it back while
// it sleeps must not release it again.
func poolHooks(h *resource.SegmentHooks) (blocks, sleep *resource.SegmentHooks) {
	if h == nil || h.Acquired == nil && h.Released == nil {
		return h, nil
	}
	var mu sync.Mutex
	slept := map[cuda.DevicePtr]bool{}
	blocks = &resource.SegmentHooks{
		Acquired: h.Acquired,
		Released: func(p cuda.DevicePtr, n uint64) error {
			mu.Lock()
			gone := slept[p]
			delete(slept, p)
			mu.Unlock()
			if gone || h.Released == nil {
				return nil
			}
			return h.Released(p, n)
		},
	}
	sleep = &resource.SegmentHooks{
		Acquired: func(p cuda.DevicePtr, n uint64) error {
			if h.Acquired != nil {
				if err := h.Acquired(p, n); err != nil {
					return err
				}
			}
			mu.Lock()
			delete(slept, p)
			mu.Unlock()
			return nil
		},
		Released: func(p cuda.DevicePtr, n uint64) error {
			if h.Released != nil {
				if err := h.Released(p, n); err != nil {
					return err
				}
			}
			mu.Lock()
			slept[p] = true
			mu.Unlock()
			return nil
		},
	}
	return blocks, sleep
}
