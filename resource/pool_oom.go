package resource

// DevicePool and PinnedPool: surviving out-of-memory by trimming the pool.

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// retryAfterTrim runs, with the pool acquired, after the pool failed an
// allocation of size bytes on s with out-of-memory (err). The pool may
// hold unused memory in pieces that do not fit the request, and memory
// freed on s may not be reusable yet: so it waits for s, trims the pool to
// nothing (a new mapping of the right size can then use the memory), and
// tries once more. The pool regrows on later allocations.
//
// A request larger than the pool's MaxSize or the device's memory can
// never fit: err is returned marked neverFits (so that Retrying makes no
// retry either), without the wait and the trim, which would cost the
// pool's cached memory for nothing.
func (c *poolCore) retryAfterTrim(s *cuda.Stream, size uint64, err error) (cuda.DevicePtr, error) {
	if c.maxSize != 0 && size > c.maxSize {
		return 0, neverFits{fmt.Errorf("%w (more than the pool's MaxSize, %d bytes)", err, c.maxSize)}
	}
	if c.kind == "DevicePool" {
		if total, terr := c.dev.TotalMemory(); terr == nil && size > total {
			return 0, neverFits{fmt.Errorf("%w (more than the %d bytes of %v)", err, total, c.dev)}
		}
	}
	if serr := s.Sync(); serr != nil {
		return 0, errors.Join(err, fmt.Errorf("waiting for %v on out-of-memory: %w", s, serr))
	}
	if terr := c.pool.TrimTo(0); terr != nil {
		return 0, errors.Join(err, fmt.Errorf("trimming the pool on out-of-memory: %w", terr))
	}
	return s.MemAllocFromPoolAsync(c.pool, size)
}
