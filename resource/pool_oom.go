package resource

// DevicePool and PinnedPool: surviving out-of-memory by trimming the pool.

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// retryAfterTrim runs after the pool failed an allocation of size bytes on
// s with out-of-memory (err). The pool may hold unused memory in pieces
// that do not fit the request (a release threshold keeps them across
// synchronizations), and memory freed on s may not be reusable yet. So it
// waits for s (its frees complete), trims the pool to nothing (the unused
// memory goes back to the system, where a new mapping of the right size
// can use it), and tries once more, as PyTorch's caching allocator frees
// its cached blocks and retries. The pool regrows on later allocations.
// It runs with the pool acquired.
//
// A request larger than the pool's MaxSize or the device's memory can
// never fit: err is returned as it is (marked, so that Retrying makes no
// retry either), without the wait and the trim, which would cost the
// pool's cached memory (and the next allocations their driver calls) for
// nothing.
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
