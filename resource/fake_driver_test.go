package resource

// CPU tests that need a driver (streams that can be closed, driver pools),
// run against the fake driver (internal/testkit/fakecuda) in a child process: the
// package's other CPU tests run without a driver, and its GPU tests on a
// real one, in this process.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// onFakeDriver reports whether the calling test runs over the fake driver
// (one device) now: see fakecuda.OnFake.
func onFakeDriver(t *testing.T) bool {
	t.Helper()
	return fakecuda.OnFake(t, "FAKECUDA_DEVICES=1")
}

// Allocations on a stream that was closed are refused with cuda.ErrClosed
// on every path, as the pools refuse them: from the stream's cache, from
// its free list, for size 0. A free on it is refused too (the buffer stays
// open, and closes on another stream), and what was freed on it before
// its Close still serves other streams.
func TestSubAllocatorClosedStreamFake(t *testing.T) {
	if !onFakeDriver(t) {
		return
	}
	dev, err := cuda.GetDevice(0)
	require.NoError(t, err)
	pool, err := NewDevicePool(dev, &DevicePoolOptions{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, pool.Close()) }()
	sa, err := NewSubAllocator(pool, &SubAllocatorOptions{GrowSize: 4 * saMiB})
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	s2, err := dev.NewStream()
	require.NoError(t, err)

	// One allocation live on s2 (first: s then takes the block's free
	// range), a small range freed into s's cache, and a large one (past
	// the cache's share of GrowSize) onto s's list.
	live, err := sa.Allocate(saKiB, s2)
	require.NoError(t, err)
	small, err := sa.Allocate(saKiB, s)
	require.NoError(t, err)
	require.NoError(t, small.Close())
	large, err := sa.Allocate(2*saMiB, s)
	require.NoError(t, err)
	require.NoError(t, large.Close())
	sa.mu.Lock()
	onList := sa.lists[s] != nil && sa.lists[s].bytes >= 2*saMiB
	sa.mu.Unlock()
	require.True(t, onList, "the large range is on s's list")
	c := sa.cacheOf(s)
	require.NotNil(t, c)
	c.own.mu.Lock()
	cached := len(c.own.free)
	c.own.mu.Unlock()
	require.Equal(t, 1, cached, "the small range is in s's cache")
	require.NoError(t, s.Close())
	require.NoError(t, s2.Close())

	for _, size := range []uint64{saKiB, 2 * saMiB, 0, 3 * saMiB} {
		_, err := sa.Allocate(size, s)
		require.ErrorIs(t, err, cuda.ErrClosed, "%d bytes on a closed stream", size)
		assert.Contains(t, err.Error(), "SubAllocator.Allocate")
		_, perr := pool.Allocate(size, s)
		require.ErrorIs(t, perr, cuda.ErrClosed, "the pool's answer, %d bytes", size)
	}

	err = live.Close() // on s2, closed
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "SubAllocator.Deallocate")
	assert.False(t, live.IsClosed(), "the buffer stays open")
	assert.Equal(t, 1, sa.Stats().Allocations)
	require.NoError(t, live.CloseOn(dev.DefaultStream()))

	// s's free ranges serve another stream, once ordered after it.
	b, err := sa.Allocate(2*saMiB, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	assert.Equal(t, 1, sa.Stats().Blocks, "no growth")
	require.NoError(t, sa.Close())
	require.NoError(t, dev.Sync())
	attrs, err := pool.Attributes()
	require.NoError(t, err)
	assert.Zero(t, attrs.UsedMemCurrent, "everything back in the pool")
}

// A DevicePool request larger than the device fails at once: the pool
// keeps its cached memory (no trim for a retry that must fail), and
// Retrying does not call its RetryFunc for it.
func TestDevicePoolOOMBeyondDeviceFake(t *testing.T) {
	if !onFakeDriver(t) {
		return
	}
	dev, err := cuda.GetDevice(0)
	require.NoError(t, err)
	pool, err := NewDevicePool(dev, &DevicePoolOptions{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, pool.Close()) }()
	b, err := pool.Allocate(saMiB, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, dev.Sync())
	before, err := pool.Attributes()
	require.NoError(t, err)
	require.NotZero(t, before.ReservedMemCurrent, "the freed memory stays cached")

	total, err := dev.TotalMemory()
	require.NoError(t, err)
	calls := 0
	r := NewRetrying(pool, func(uint64, int) bool { calls++; return calls < 3 })
	_, err = r.Allocate(total+1, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "DevicePool.Allocate")
	assert.Zero(t, calls, "no retry")
	after, err := pool.Attributes()
	require.NoError(t, err)
	assert.Equal(t, before.ReservedMemCurrent, after.ReservedMemCurrent, "not trimmed")

	// A request that fits once memory is freed is still retried.
	held, err := pool.Allocate(saMiB, nil)
	require.NoError(t, err)
	_, err = r.Allocate(total, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Equal(t, 3, calls)
	require.NoError(t, held.Close())
}

// A request over an owned pool's MaxSize can never fit: the pool neither
// waits nor trims (it keeps what it caches), and Retrying calls no
// RetryFunc. Both kinds of pool.
func TestPoolOOMBeyondMaxSizeFake(t *testing.T) {
	if !onFakeDriver(t) {
		return
	}
	dev, err := cuda.GetDevice(0)
	require.NoError(t, err)
	const max = 8 * saMiB
	dp, err := NewDevicePool(dev, &DevicePoolOptions{MaxSize: max})
	require.NoError(t, err)
	defer func() { assert.NoError(t, dp.Close()) }()
	pp, err := NewPinnedPool(&PinnedPoolOptions{MaxSize: max})
	require.NoError(t, err)
	defer func() { assert.NoError(t, pp.Close()) }()
	for _, tc := range []struct {
		name  string
		pool  buffer.MemoryResource
		attrs func() (PoolAttributes, error)
	}{
		{"DevicePool", dp, dp.Attributes},
		{"PinnedPool", pp, pp.Attributes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, err := tc.pool.AllocatePtr(saMiB, nil)
			require.NoError(t, err)
			require.NoError(t, tc.pool.Deallocate(p, saMiB, nil))
			require.NoError(t, dev.Sync())
			before, err := tc.attrs()
			require.NoError(t, err)
			require.NotZero(t, before.ReservedMemCurrent, "the freed memory stays cached")

			calls := 0
			r := NewRetrying(tc.pool, func(uint64, int) bool { calls++; return calls < 3 })
			_, _, err = r.AllocatePtr(max+1, nil)
			require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
			assert.Contains(t, err.Error(), "MaxSize")
			assert.Zero(t, calls, "no retry")
			after, err := tc.attrs()
			require.NoError(t, err)
			assert.Equal(t, before.ReservedMemCurrent, after.ReservedMemCurrent, "not trimmed")
		})
	}
}
