package resource

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// A SubAllocator dropped without Close, its buffers all closed: the
// buffer package's safety net gives its upstream block back. The block's
// Buffer and the sub-allocation's come from one slab; when a closed
// Buffer's ledger entry kept its resource (the SubAllocator, which holds
// the block's Buffer), the slab was reachable from its own cleanup's
// argument and never collected (found in review).
func TestDroppedSubAllocatorBlockIsFreed(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one P: one slab cursor
	up := newSAUpstream()
	func() {
		a, err := NewSubAllocator(up, &SubAllocatorOptions{GrowSize: 64 * saKiB, InitialSize: 64 * saKiB})
		require.NoError(t, err)
		a.order = &saOrder{}
		b, err := a.Allocate(256, nil)
		require.NoError(t, err)
		require.NoError(t, b.Close())
	}()
	for range 300 {
		if _, _, live := up.counts(); live == 0 {
			break
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	_, _, live := up.counts()
	assert.Zero(t, live, "the upstream block of a dropped SubAllocator is given back")
}

// zeroUp answers every allocation with address 0: a broken upstream.
type zeroUp struct{}

func (zeroUp) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0, s, nil
}
func (zeroUp) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (zeroUp) DeviceAccessible() bool                                { return true }
func (zeroUp) HostAccessible() bool                                  { return false }
func (zeroUp) DeviceID() int                                         { return 0 }

// Limiting gives its reservation back when the upstream hands out address
// 0 for a nonzero size: such a Buffer is never deallocated, so the budget
// would be lost for good (found in review).
func TestLimitingRefusesAddressZero(t *testing.T) {
	l := NewLimiting(zeroUp{}, 4096)
	_, err := l.Allocate(4096, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Zero(t, l.Used())
}
