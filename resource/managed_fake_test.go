package resource_test

// Managed memory where the driver or the devices lack what it needs,
// played by the fake driver in a child process: a CUDA 12.8 driver (no
// managed pools, no batched prefetch or discard) and devices without
// concurrent managed access. Each refusal matches cuda.ErrNotSupported
// and says why; what remains possible still works.

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
)

// onFakeManaged runs the calling test over the fake driver's two devices
// with env added: see fakecuda.OnFake.
func onFakeManaged(t *testing.T, env ...string) bool {
	t.Helper()
	return fakecuda.OnFake(t, append([]string{"FAKECUDA_DEVICES=2"}, env...)...)
}

// fakeStats opens the fake driver the process runs on, once every
// device's primary context is in use (they stay retained for the
// process, so they are not counted against the test).
func fakeStats(t *testing.T) *fakecuda.Driver {
	t.Helper()
	devs, err := cuda.Devices()
	require.NoError(t, err)
	syncAll(t, devs...)
	d, err := fakecuda.Open(os.Getenv("CUDAMEM_DRIVER"))
	require.NoError(t, err)
	return d
}

// TestManagedOldDriverFake: on a CUDA 12.8 driver, managed pools and the
// batched calls are refused as not supported; cuMemAllocManaged memory
// still prefetches, takes advice and reads it back.
func TestManagedOldDriverFake(t *testing.T) {
	if !onFakeManaged(t, "FAKECUDA_VERSION=12080") {
		return
	}
	dev := cudatest.Device(t)
	s := cudatest.Stream(t, dev)
	stats := fakeStats(t)
	base := stats.Snapshot()

	_, err := resource.NewManagedPool(dev, nil)
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "NewManagedPool: cuda: not supported: managed memory pools need a CUDA 13.0 driver (this one is 12.8)")
	_, err = resource.CurrentManagedPool(dev)
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "CurrentManagedPool: cuda: not supported: managed memory pools need a CUDA 13.0 driver")

	m, err := resource.NewManaged(dev, nil)
	require.NoError(t, err)
	b, err := m.Allocate(managedSize, s)
	require.NoError(t, err)
	for name, err := range map[string]error{
		"PrefetchBatch":   resource.PrefetchBatch([]*buffer.Buffer{b}, []cuda.MemLocation{cuda.HostLocation()}, s),
		"DiscardBatch":    resource.DiscardBatch([]*buffer.Buffer{b}, s),
		"DiscardPrefetch": resource.DiscardPrefetch(b, cuda.DeviceLocation(dev), s),
	} {
		require.ErrorIs(t, err, cuda.ErrNotSupported, name)
		assert.Contains(t, err.Error(), name+": ", name)
		assert.Contains(t, err.Error(), "the installed driver does not provide", name)
	}
	require.NoError(t, resource.Prefetch(b, cuda.DeviceLocation(dev), s))
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}))
	info, err := resource.QueryManaged(b)
	require.NoError(t, err)
	assert.Equal(t, cuda.ManagedRange{ReadMostly: true, LastPrefetchLocation: cuda.DeviceLocation(dev)}, info)
	require.NoError(t, b.Close())
	require.NoError(t, s.Sync())
	assert.Empty(t, stats.Snapshot().Diff(base), "everything given back")
}

// TestManagedNoConcurrentAccessFake: devices without concurrent managed
// access refuse managed pools, device targets and accessors, and the
// batches, naming the device; host prefetches and host advice still
// work.
func TestManagedNoConcurrentAccessFake(t *testing.T) {
	if !onFakeManaged(t, "FAKECUDA_NO_CONCURRENT_MANAGED=1") {
		return
	}
	dev := cudatest.Device(t)
	s := cudatest.Stream(t, dev)
	stats := fakeStats(t)
	base := stats.Snapshot()

	_, err := resource.NewManagedPool(dev, nil)
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "lacks concurrent managed access")
	_, err = resource.CurrentManagedPool(dev)
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "lacks concurrent managed access")

	m, err := resource.NewManaged(dev, nil)
	require.NoError(t, err)
	b, err := m.Allocate(managedSize, s)
	require.NoError(t, err)
	here := cuda.DeviceLocation(dev)
	for name, err := range map[string]error{
		"Prefetch":      resource.Prefetch(b, here, s),
		"Advise":        resource.Advise(b, cuda.MemAdviseSetAccessedBy, here),
		"PrefetchBatch": resource.PrefetchBatch([]*buffer.Buffer{b}, []cuda.MemLocation{cuda.HostLocation()}, s),
		"Discard":       resource.Discard(b, s),
	} {
		require.ErrorIs(t, err, cuda.ErrNotSupported, name)
		assert.Contains(t, err.Error(), name+": ", name)
		assert.Contains(t, err.Error(), "concurrent managed access", name)
	}
	copy(hostView(b), cudatest.Pattern(managedSize, 190))
	require.NoError(t, resource.Prefetch(b, cuda.HostLocation(), s))
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetAccessedBy, cuda.HostLocation()))
	require.NoError(t, s.Sync())
	info, err := resource.QueryManaged(b)
	require.NoError(t, err)
	assert.Equal(t, cuda.ManagedRange{AccessedBy: []cuda.MemLocation{cuda.HostLocation()}, LastPrefetchLocation: cuda.HostLocation()}, info)
	assert.Equal(t, cudatest.Pattern(managedSize, 190), hostView(b))
	require.NoError(t, b.Close())
	require.NoError(t, s.Sync())
	assert.Empty(t, stats.Snapshot().Diff(base), "everything given back")
}

// TestManagedPoolGivesBackFake: a managed pool's memory is counted as
// managed memory while live and all of it, with the pool, goes back by
// the time the last buffer and the pool are closed; the pool's
// preferred location is every allocation's preference from the start.
func TestManagedPoolGivesBackFake(t *testing.T) {
	if !onFakeManaged(t) {
		return
	}
	dev := cudatest.Device(t)
	s := cudatest.Stream(t, dev)
	stats := fakeStats(t)
	base := stats.Snapshot()
	mr, err := resource.NewManagedPool(dev, &resource.ManagedPoolOptions{PreferredLocation: cuda.HostLocation()})
	require.NoError(t, err)
	b, err := mr.Allocate(managedSize, s)
	require.NoError(t, err)
	assert.Equal(t, int64(managedSize), stats.Stat(fakecuda.ManagedBytes)-base[fakecuda.ManagedBytes])
	assert.Equal(t, int64(1), stats.Stat(fakecuda.Pools)-base[fakecuda.Pools])
	info, err := resource.QueryManaged(b)
	require.NoError(t, err)
	assert.Equal(t, cuda.HostLocation(), info.PreferredLocation)
	require.NoError(t, mr.Close())
	assert.Equal(t, int64(1), stats.Stat(fakecuda.Pools)-base[fakecuda.Pools], "the live buffer keeps the pool")
	require.NoError(t, b.Close())
	require.NoError(t, s.Sync())
	assert.Empty(t, stats.Snapshot().Diff(base), "everything given back")
}
