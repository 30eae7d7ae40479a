package buffer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/resource"
)

// dropSubAllocated allocates n Buffers from a and drops them unclosed.
//
//go:noinline
func dropSubAllocated(t *testing.T, a *resource.SubAllocator, n int) {
	for range n {
		_, err := a.Allocate(256, nil)
		require.NoError(t, err)
	}
}

// Issue 19: a leaked Buffer carved from a SubAllocator was neither
// counted nor freed while the SubAllocator lived, because its slab also
// held the Buffer of the SubAllocator's block (made just before it), which
// the SubAllocator keeps: the slab reached itself. The block's Buffer now
// has no slab (buffer.Owned), so the net frees the leak at once.
func TestLeakedSubAllocatorBufferIsFreed(t *testing.T) {
	up := newFake()
	a, err := resource.NewSubAllocator(up, &resource.SubAllocatorOptions{GrowSize: 1 << 20})
	require.NoError(t, err)
	leaks, kept := buffer.Leaks(), buffer.LeaksKept()

	// The first allocation takes the block from up: both are made here,
	// in fresh slabs that no other test's Buffers share.
	buffer.FreshSlabs()
	const n = 3
	dropSubAllocated(t, a, n)
	buffer.FreshSlabs()
	expectedLeaks.Add(n)
	collectUntil(t, "the leaked Buffers were not freed while their SubAllocator lives", func() bool {
		return a.Stats().Allocations == 0
	})
	assert.Equal(t, leaks+n, buffer.Leaks(), "each counted")
	assert.Equal(t, kept, buffer.LeaksKept(), "and freed")
	assert.Equal(t, 1, up.liveCount(), "the block stays with the SubAllocator")

	// Dropped in turn (without Close, which would wait for the default
	// stream, hence the driver): the net frees the block too.
	expectedLeaks.Add(1)
	collectUntil(t, "the dropped SubAllocator's block was not freed", func() bool { return up.liveCount() == 0 })
	assert.Equal(t, leaks+n+1, buffer.Leaks())
}
