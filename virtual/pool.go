package virtual

import (
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
	// the address ranges.
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
	r, err := New(dev, o.Memory)
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
		Segments: o.Segments,
		Release:  keep,
	})
}
