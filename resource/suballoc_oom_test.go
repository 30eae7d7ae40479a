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

// A request that exceeds MaxSize on its own fails at once: nothing is
// given back (the initial block stays, for the allocations that fit),
// and the error describes the state that refused it.
func TestSubAllocatorOOMBeyondMaxSizeKeepsBlocks(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, InitialSize: saMiB, MaxSize: 4 * saMiB})
	defer func() { assert.NoError(t, a.Close()) }()

	_, _, err := a.AllocatePtr(8*saMiB, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "8388608 bytes")
	assert.Contains(t, err.Error(), "MaxSize 4194304")
	assert.Contains(t, err.Error(), "1048576 reserved", "the state at the failure")
	assert.True(t, isNeverFits(err), "marked: no retry can help")
	assert.Empty(t, up.frees, "the initial block stays")
	st := a.Stats()
	assert.Equal(t, uint64(saMiB), st.Reserved)
	assert.Equal(t, 1, st.Blocks)
	assert.Zero(t, st.OutOfMemoryTrims)
}

// A request that would exceed MaxSize even with every free block given
// back (the blocks with live allocations leave too little under the
// cap) fails without a trim, and the error describes the state that
// refused it.
func TestSubAllocatorOOMTrimCannotMakeRoom(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, InitialSize: saMiB, MaxSize: 4 * saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	p, _, err := a.AllocatePtr(2*saMiB, nil) // a live block of its own: 3 MiB held
	require.NoError(t, err)

	// 3 MiB more: past the cap now (6 MiB), and after giving back the
	// free initial block too (5 MiB).
	_, _, err = a.AllocatePtr(3*saMiB, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "3145728 reserved", "the state at the failure")
	assert.False(t, isNeverFits(err), "it would fit once the live block is freed")
	assert.Empty(t, up.frees, "the initial block stays")
	assert.Zero(t, a.Stats().OutOfMemoryTrims)
	assert.Equal(t, 2, a.Stats().Blocks)

	// Once the trim can make room, it does.
	require.NoError(t, a.Deallocate(p, 2*saMiB, nil))
	q, _, err := a.AllocatePtr(4*saMiB-256, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), a.Stats().OutOfMemoryTrims)
	require.NoError(t, a.Deallocate(q, 4*saMiB-256, nil))
}

// A retry that fails after the trim names the state it failed in and
// says that the trim was made.
func TestSubAllocatorOOMRetryFailsToo(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, InitialSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	up.limit = 2 * saMiB // the upstream refuses 2 MiB whatever is given back

	_, _, err := a.AllocatePtr(3*saMiB, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "after giving back 1048576 bytes")
	assert.Equal(t, uint64(1), a.Stats().OutOfMemoryTrims)
}

// Retrying does not call its RetryFunc for a request that can never fit
// (beyond a SubAllocator's MaxSize, a Limiting's limit): whatever it
// frees, the retry must fail. A request that fits once memory is freed
// is retried as before.
func TestRetryingNeverFits(t *testing.T) {
	a, _, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, MaxSize: 4 * saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	calls := 0
	retry := func(uint64, int) bool { calls++; return calls%3 != 0 }

	_, _, err := NewRetrying(a, retry).AllocatePtr(8*saMiB, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Zero(t, calls, "beyond MaxSize")

	lim := NewLimiting(newSAUpstream(), saMiB)
	r := NewRetrying(lim, retry)
	_, _, err = r.AllocatePtr(2*saMiB, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Zero(t, calls, "beyond the limit")

	p, _, err := lim.AllocatePtr(saMiB/2, nil)
	require.NoError(t, err)
	_, _, err = r.AllocatePtr(saMiB, nil) // fits once p is freed
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Equal(t, 3, calls, "retried until the RetryFunc gave up")
	assert.False(t, isNeverFits(err))
	require.NoError(t, lim.Deallocate(p, saMiB/2, nil))
}
