package resource

// CPU tests of the SubAllocator's retry after out-of-memory: the fake
// upstream refuses past a byte limit, as a full device would.

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// A request that fits only once the free blocks are given back succeeds
// after one Trim: the free block goes back to the upstream, and a new
// block of the right size is taken.
func TestSubAllocatorOOMTrimsAndRetries(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	up.limit = 2 * saMiB

	p, _, err := a.AllocatePtr(saMiB, nil)
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, saMiB, nil)) // the 1 MiB block is now free, held
	require.Equal(t, uint64(saMiB), a.Stats().Reserved)

	// 1.5 MiB needs a new block; 1 MiB held + 1.5 MiB is past the limit.
	const big = 3 * saMiB / 2
	q, _, err := a.AllocatePtr(big, nil)
	require.NoError(t, err, "the retry after giving back the free block")
	st := a.Stats()
	assert.Equal(t, uint64(1), st.OutOfMemoryTrims)
	assert.Equal(t, 1, st.Blocks)
	require.Len(t, up.frees, 1, "the free block went back to the upstream")
	assert.Equal(t, uint64(saMiB), up.frees[0].size)
	// Asked for: the first block, the refused 1.5 MiB (the fake counts
	// only successes), the 1.5 MiB that fit.
	require.Len(t, up.allocs, 2)
	require.NoError(t, a.Deallocate(q, big, nil))
}

// With nothing free to give back, the out-of-memory error is returned at
// once, unchanged in kind, and nothing is retried.
func TestSubAllocatorOOMNothingToTrim(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	up.limit = 2 * saMiB

	p, _, err := a.AllocatePtr(saMiB, nil) // live: its block cannot go back
	require.NoError(t, err)
	_, _, err = a.AllocatePtr(3*saMiB/2, nil)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrorOutOfMemory), "%v", err)
	assert.Zero(t, a.Stats().OutOfMemoryTrims)
	assert.Empty(t, up.frees)
	require.NoError(t, a.Deallocate(p, saMiB, nil))
}

// MaxSize counts as out of memory too: a free block given back makes room
// under the cap.
func TestSubAllocatorOOMMaxSizeTrims(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, MaxSize: 2 * saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	p, _, err := a.AllocatePtr(saMiB, nil)
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, saMiB, nil))
	q, _, err := a.AllocatePtr(2*saMiB, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), a.Stats().OutOfMemoryTrims)
	assert.Len(t, up.frees, 1)
	require.NoError(t, a.Deallocate(q, 2*saMiB, nil))
}
