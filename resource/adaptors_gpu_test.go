package resource_test

// GPU tests of the adaptors over a real DevicePool; they skip without a
// GPU (cudatest.Device).

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// usedMem is the pool's UsedMemCurrent once the device's work (frees
// included) has finished.
func usedMem(t *testing.T, pool *resource.DevicePool, dev *cuda.Device) uint64 {
	t.Helper()
	syncAll(t, dev)
	a, err := pool.Attributes()
	require.NoError(t, err)
	return a.UsedMemCurrent
}

// TestLimitingDevicePoolGPU: the limit refuses before the pool is asked,
// and closing the buffers gives the pool its memory back.
func TestLimitingDevicePoolGPU(t *testing.T) {
	dev := cudatest.Device(t)
	pool, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	checkLeaks(t, pool, dev)
	start := usedMem(t, pool, dev)

	lim := resource.NewLimiting(pool, 4*mib)
	s := cudatest.Stream(t, dev)
	a, err := lim.Allocate(3*mib, s)
	require.NoError(t, err)
	assert.Same(t, s, a.Stream())
	require.NoError(t, s.MemsetD8Async(a.Ptr(), 1, a.Size()), "the memory is real device memory")
	b, err := lim.Allocate(mib, nil)
	require.NoError(t, err)
	assert.Same(t, dev.DefaultStream(), b.Stream(), "nil stream: the pool's default")
	assert.Equal(t, uint64(4*mib), lim.Used())
	assert.GreaterOrEqual(t, usedMem(t, pool, dev)-start, uint64(4*mib))

	_, err = lim.Allocate(1, s)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "would exceed the limit of 4194304 bytes (4194304 in use)")

	closeBuf(t, a)
	closeBuf(t, b)
	assert.Zero(t, lim.Used())
	assert.Equal(t, start, usedMem(t, pool, dev))
}

// TestStatisticsDevicePoolGPU: the adaptor's current bytes follow the
// pool's UsedMemCurrent. An owned pool keeps other tests' memory out of
// the comparison, and sizes of whole 2 MiB blocks keep the pool's rounding
// out of it.
func TestStatisticsDevicePoolGPU(t *testing.T) {
	dev := cudatest.Device(t)
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{MaxSize: 64 * mib})
	checkLeaks(t, pool, dev)
	start := usedMem(t, pool, dev)

	st := resource.NewStatistics(pool)
	tr := resource.NewTracking(st, &resource.TrackingOptions{CaptureStacks: true})
	var bufs []*buffer.Buffer
	for _, n := range []uint64{2 * mib, 4 * mib, 8 * mib} {
		b, err := tr.Allocate(n, nil)
		require.NoError(t, err)
		bufs = append(bufs, b)
		assert.Equal(t, st.Stats().CurrentBytes, usedMem(t, pool, dev)-start)
	}
	assert.Equal(t, uint64(14*mib), st.Stats().PeakBytes)
	assert.Equal(t, 3, tr.LiveCount(), tr.Report())

	_, err := tr.Allocate(1<<50, nil) // the pool refuses
	require.Error(t, err)
	assert.Equal(t, uint64(1), st.Stats().Failures)

	for _, b := range bufs {
		closeBuf(t, b)
		assert.Equal(t, st.Stats().CurrentBytes, usedMem(t, pool, dev)-start)
	}
	assert.Zero(t, tr.LiveCount(), tr.Report())
	assert.Equal(t, resource.Stats{PeakBytes: 14 * mib, PeakCount: 3, TotalBytes: 14 * mib, TotalCount: 3, Failures: 1}, st.Stats())
}
