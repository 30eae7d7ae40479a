package resource

// SubAllocator: surviving out-of-memory by giving back free blocks.

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// retryAfterTrim runs after take failed with out-of-memory (err): the
// upstream, or MaxSize, refused a new block. Blocks that are entirely
// free may still be held (free ranges too small for the request, or on
// streams it cannot use), and giving them back may make room for a block
// that fits, as PyTorch's caching allocator frees its cached blocks and
// retries. So Trim, and if it gave anything back, take once more. The
// error of a failed retry is returned joined with Trim's, if any.
func (a *SubAllocator) retryAfterTrim(size uint64, s *cuda.Stream, err error) (cuda.DevicePtr, error) {
	gave, terr := a.trim()
	if gave == 0 {
		// Nothing went back: the retry would fail the same way.
		if terr != nil {
			return 0, errors.Join(err, fmt.Errorf("giving back free blocks on out-of-memory: %w", terr))
		}
		return 0, err
	}
	a.mu.Lock()
	a.oomTrim++
	a.mu.Unlock()
	ptr, rerr := a.take(size, s)
	if rerr != nil && terr != nil {
		rerr = errors.Join(rerr, fmt.Errorf("giving back free blocks on out-of-memory: %w", terr))
	}
	return ptr, rerr
}
