package resource

// SubAllocator: surviving out-of-memory by giving back free blocks.

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// retryAfterTrim runs after take failed with out-of-memory (err): the
// upstream, or MaxSize, refused a new block. Entirely free blocks may
// still be held (their ranges too small for the request, or on streams it
// cannot use), and giving them back may make room for a block that fits:
// so Trim, and if it gave anything back, take once more. A failed retry's
// error is joined with Trim's, if any.
//
// A request that trimming cannot make fit (over MaxSize alone, or with the
// blocks that have live allocations) fails with err as it is, and every
// block stays: giving back memory the next allocations would take again,
// for a retry that must fail, would only cost them the upstream calls.
func (a *SubAllocator) retryAfterTrim(size uint64, s *cuda.Stream, err error) (cuda.DevicePtr, error) {
	if isNeverFits(err) || !a.trimMayFit(size) {
		return 0, err
	}
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
	if rerr != nil {
		// The retry's error describes the state it failed in, after the
		// trim; say that one was made.
		rerr = fmt.Errorf("%w (after giving back %d bytes of entirely free blocks on out-of-memory)", rerr, gave)
		if terr != nil {
			rerr = errors.Join(rerr, fmt.Errorf("giving back free blocks on out-of-memory: %w", terr))
		}
	}
	return ptr, rerr
}

// trimMayFit reports whether giving back the entirely free blocks (what
// trim gives back) can leave room under MaxSize for a block of size
// bytes. Without a cap it is always worth trying: then the upstream
// refused, and memory given back to it may be what it lacked.
func (a *SubAllocator) trimMayFit(size uint64) bool {
	if a.max == 0 {
		return true
	}
	n, ok := alignUp(size, a.align)
	if !ok {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	// A range a cache holds counts as live in its block: back in the
	// books, the blocks entirely free are seen (trim flushes them too).
	a.flushAllLocked()
	kept := a.held // what stays held after the trim
	for _, b := range a.blocks {
		if b.live == 0 && !b.releasing {
			kept -= b.size
		}
	}
	return n+a.alignExtra() <= a.max-min(a.max, kept)
}
