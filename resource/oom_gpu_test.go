package resource_test

// GPU test of surviving out-of-memory: a SubAllocator fills the device
// with blocks, frees everything (the blocks stay cached), and then asks
// for a block larger than any of them, which fits only once the cache is
// given back: the SubAllocator trims and retries, and the pool below it,
// holding the freed blocks' memory, trims and retries too.

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

func TestSubAllocatorGPUOutOfMemoryReleasesCache(t *testing.T) {
	if testing.Short() {
		t.Skip("fills the device's memory")
	}
	dev := cudatest.Device(t)
	s := cudatest.Stream(t, dev)
	free, _, err := dev.MemInfo()
	require.NoError(t, err)
	// Blocks of a 32nd of the free memory (2 MiB multiples, at least
	// 64 MiB): a few dozen allocations fill the device whatever its size.
	chunk := max(free/32&^(2*mib-1), 64*mib)
	sa := gpuSub(t, dev, &resource.SubAllocatorOptions{GrowSize: chunk})

	var ptrs []cuda.DevicePtr
	for range 256 { // bounded: 32 fill it, a few more for what MemInfo missed
		p, _, err := sa.AllocatePtr(chunk, s)
		if err != nil {
			require.True(t, errors.Is(err, cuda.ErrorOutOfMemory), "filling: %v", err)
			break
		}
		ptrs = append(ptrs, p)
	}
	require.Greater(t, len(ptrs), 4, "the device should hold several %d-byte blocks", chunk)
	t.Logf("filled with %d blocks of %d bytes", len(ptrs), chunk)
	for _, p := range ptrs {
		require.NoError(t, sa.Deallocate(p, chunk, s))
	}
	st := sa.Stats()
	require.Equal(t, len(ptrs), st.Blocks, "the freed blocks stay cached")

	// Twice a block: no free range is that large (blocks never merge),
	// and the device has no room for a new block until the cached ones go.
	big := 2 * chunk
	p, _, err := sa.AllocatePtr(big, s)
	require.NoError(t, err, "after giving back the cached blocks")
	st = sa.Stats()
	assert.Equal(t, uint64(1), st.OutOfMemoryTrims)
	assert.Equal(t, 1, st.Blocks)
	k := cudatest.LoadKernels(t, dev)
	require.NoError(t, k.Write(s, p, big, 7))
	bad, err := k.Check(s, p, big, 7)
	require.NoError(t, err)
	assert.Zero(t, bad)
	require.NoError(t, sa.Deallocate(p, big, s))
	require.NoError(t, s.Sync())
}

// A DevicePool request larger than the device fails at once: the pool
// keeps what it caches (no wait and no trim for a retry that must fail),
// and a Retrying above it does not call its RetryFunc.
func TestDevicePoolGPUOutOfMemoryBeyondDevice(t *testing.T) {
	dev := cudatest.Device(t)
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{})
	b, err := pool.Allocate(4*mib, nil)
	require.NoError(t, err)
	closeBuf(t, b)
	syncAll(t, dev)
	before, err := pool.Attributes()
	require.NoError(t, err)
	require.NotZero(t, before.ReservedMemCurrent, "the freed memory stays cached")

	total, err := dev.TotalMemory()
	require.NoError(t, err)
	calls := 0
	r := resource.NewRetrying(pool, func(uint64, int) bool { calls++; return calls < 3 })
	_, err = r.Allocate(total+1, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Zero(t, calls, "no retry")
	after, err := pool.Attributes()
	require.NoError(t, err)
	// The driver may reserve address space for the failed request and
	// keep it: only a trim would lower what the pool holds.
	assert.GreaterOrEqual(t, after.ReservedMemCurrent, before.ReservedMemCurrent, "not trimmed")
}
