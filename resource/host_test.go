package resource_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// checkHostMemory proves that mr's memory is shared by the CPU and every
// device: kernels write and the host view reads, the host writes and a
// kernel checks.
func checkHostMemory(t *testing.T, mr buffer.MemoryResource, devs []*cuda.Device) {
	t.Helper()
	assert.True(t, mr.HostAccessible())
	assert.True(t, mr.DeviceAccessible())
	assert.Equal(t, -1, mr.DeviceID())
	s0 := cudatest.Stream(t, devs[0])
	const n = mib + 3
	b, err := buffer.Allocate(mr, n, s0)
	require.NoError(t, err)
	defer closeBuf(t, b)
	require.NoError(t, s0.Sync())
	for i, d := range devs {
		k, s := cudatest.LoadKernels(t, d), cudatest.Stream(t, d)
		seed := uint32(40 + i)
		require.NoError(t, k.Write(s, b.Ptr(), n, seed))
		require.NoError(t, s.Sync())
		require.Equal(t, cudatest.Pattern(n, seed), hostView(b), "host view after a kernel write on %v", d)
		copy(hostView(b), cudatest.Pattern(n, seed+100))
		k.RequireCheck(t, s, b.Ptr(), n, seed+100)
	}
}

func allDevices(t *testing.T) []*cuda.Device {
	cudatest.Device(t)
	devs, err := cuda.Devices()
	require.NoError(t, err)
	return devs
}

func TestPinnedPool(t *testing.T) {
	devs := allDevices(t)
	mr, err := resource.NewPinnedPool(nil)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, mr.Close()) })
	checkLeaks(t, mr, devs...)
	assert.Equal(t, cuda.MemLocationTypeHost, mr.Location().Type)
	assert.False(t, mr.IsIPCEnabled())
	a, err := mr.Attributes()
	require.NoError(t, err)
	assert.Equal(t, ^uint64(0), a.ReleaseThreshold)
	for _, d := range devs {
		f, err := mr.Pool().Access(deviceLoc(d))
		require.NoError(t, err)
		assert.Equal(t, cuda.MemAccessProtReadWrite, f, "%v may use the pool", d)
	}
	checkHostMemory(t, mr, devs)
	b, err := mr.Allocate(1024, nil)
	require.NoError(t, err)
	if info, err := cuda.QueryPointer(b.Ptr()); assert.NoError(t, err) {
		assert.Equal(t, mr.Pool().Handle(), info.Pool)
	}
	closeBuf(t, b)

	t.Run("numa", func(t *testing.T) {
		f, err := devs[0].Features()
		require.NoError(t, err)
		node := max(f.HostNUMAID, 0)
		mr, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{NUMANode: &node, MaxSize: 64 * mib})
		cudatest.SkipIfNotSupported(t, err)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, mr.Close()) })
		checkLeaks(t, mr, devs...)
		assert.Equal(t, cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: int32(node)}, mr.Location())
		checkHostMemory(t, mr, devs)
	})
	t.Run("ipc", func(t *testing.T) {
		f, err := devs[0].Features()
		require.NoError(t, err)
		mr, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{IPC: true})
		cudatest.SkipIfNotSupported(t, err)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, mr.Close()) })
		assert.True(t, mr.IsIPCEnabled())
		assert.Equal(t, cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: int32(max(f.HostNUMAID, 0))}, mr.Location(),
			"IPC pools go to the first device's NUMA node (cuda.core #1603)")
		b, err := mr.Allocate(4096, nil)
		require.NoError(t, err)
		closeBuf(t, b)
	})
	t.Run("closed", func(t *testing.T) {
		mr, err := resource.NewPinnedPool(nil)
		require.NoError(t, err)
		live, err := mr.Allocate(4096, nil)
		require.NoError(t, err)
		require.NoError(t, mr.Close())
		require.NoError(t, mr.Close())
		assert.True(t, mr.IsClosed())
		require.NoError(t, live.Close(), "the last buffer destroys the pool")
		require.NoError(t, mr.Close())
		_, err = mr.Allocate(64, nil)
		assert.ErrorIs(t, err, cuda.ErrClosed)
		assert.Contains(t, err.Error(), "PinnedPool.Allocate")
		_, err = mr.Attributes()
		assert.ErrorIs(t, err, cuda.ErrClosed)
	})
}

func TestLegacyPinned(t *testing.T) {
	devs := allDevices(t)
	checkBufferLeaks(t)
	mr, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	checkHostMemory(t, mr, devs)
	b, err := mr.Allocate(4096, nil)
	require.NoError(t, err)
	info, err := cuda.QueryPointer(b.Ptr())
	require.NoError(t, err)
	assert.Equal(t, cuda.MemoryTypeHost, info.Type)
	closeBuf(t, b)
}

func TestManaged(t *testing.T) {
	dev := cudatest.Device(t)
	checkBufferLeaks(t)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	mr, err := resource.NewManaged(dev, nil)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	assert.True(t, mr.HostAccessible())
	assert.True(t, mr.DeviceAccessible())
	assert.Equal(t, dev.Ordinal(), mr.DeviceID())

	const n = 2*mib + 1
	b, err := mr.Allocate(n, s)
	require.NoError(t, err)
	defer closeBuf(t, b)
	info, err := cuda.QueryPointer(b.Ptr())
	require.NoError(t, err)
	assert.True(t, info.Managed)

	// Host writes, prefetch to the device, the kernel checks.
	copy(hostView(b), cudatest.Pattern(n, 61))
	require.NoError(t, resource.Prefetch(b, deviceLoc(dev), s))
	k.RequireCheck(t, s, b.Ptr(), n, 61)
	// The kernel writes, prefetch to the host, the host reads.
	require.NoError(t, k.Write(s, b.Ptr(), n, 62))
	require.NoError(t, resource.Prefetch(b, hostLoc, s))
	require.NoError(t, s.Sync())
	require.Equal(t, cudatest.Pattern(n, 62), hostView(b))
	// Nil stream: the target device's default stream.
	require.NoError(t, resource.Prefetch(b, deviceLoc(dev), nil))
	require.NoError(t, dev.Sync())

	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}))
	require.NoError(t, resource.Advise(b, cuda.MemAdviseUnsetReadMostly, cuda.MemLocation{}))
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetPreferredLocation, deviceLoc(dev)))
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetAccessedBy, deviceLoc(dev)))
	k.RequireCheck(t, s, b.Ptr(), n, 62)

	t.Run("preferred location", func(t *testing.T) {
		loc := hostLoc
		mr, err := resource.NewManaged(dev, &resource.ManagedOptions{PreferredLocation: &loc})
		require.NoError(t, err)
		b, err := mr.Allocate(mib, s)
		require.NoError(t, err)
		require.NoError(t, k.Write(s, b.Ptr(), mib, 63))
		require.NoError(t, s.Sync())
		assert.Equal(t, cudatest.Pattern(mib, 63), hostView(b))
		closeBuf(t, b)
	})
	t.Run("not managed", func(t *testing.T) {
		pool, err := resource.CurrentDevicePool(dev)
		require.NoError(t, err)
		pb, err := pool.Allocate(4096, s)
		require.NoError(t, err)
		defer closeBuf(t, pb)
		err = resource.Prefetch(pb, hostLoc, s)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "not managed memory")
		err = resource.Advise(pb, cuda.MemAdviseSetReadMostly, cuda.MemLocation{})
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "Advise")
	})
	t.Run("closed", func(t *testing.T) {
		b, err := mr.Allocate(4096, s)
		require.NoError(t, err)
		closeBuf(t, b)
		require.ErrorIs(t, resource.Prefetch(b, hostLoc, s), cuda.ErrClosed)
		require.ErrorIs(t, resource.Advise(b, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}), cuda.ErrClosed)
	})
}

func TestSyncDevice(t *testing.T) {
	dev := cudatest.Device(t)
	checkBufferLeaks(t)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	mr, err := resource.NewSyncDevice(dev)
	require.NoError(t, err)
	assert.True(t, mr.DeviceAccessible())
	assert.False(t, mr.HostAccessible())
	assert.Equal(t, dev.Ordinal(), mr.DeviceID())
	free0, _, err := dev.MemInfo()
	require.NoError(t, err)
	b, err := mr.Allocate(64*mib, s)
	require.NoError(t, err)
	require.NoError(t, k.Write(s, b.Ptr(), 64*mib, 70))
	assert.Equal(t, cudatest.Pattern(64*mib, 70), readBack(t, s, b.Ptr(), 64*mib))
	info, err := cuda.QueryPointer(b.Ptr())
	require.NoError(t, err)
	assert.Zero(t, info.Pool, "cuMemAlloc memory comes from no pool")
	closeBuf(t, b)
	free1, _, err := dev.MemInfo()
	require.NoError(t, err)
	assert.InDelta(t, float64(free0), float64(free1), 32*mib, "memory returned to the device")
}

// The synchronous resources refuse a closed stream at Allocate: they used
// to record it, and the buffer's Close then failed on it every time.
func TestSyncResourcesRefuseClosedStream(t *testing.T) {
	dev := cudatest.Device(t)
	sd, err := resource.NewSyncDevice(dev)
	require.NoError(t, err)
	mg, err := resource.NewManaged(dev, nil)
	require.NoError(t, err)
	lp, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	for name, mr := range map[string]buffer.MemoryResource{"SyncDevice": sd, "Managed": mg, "LegacyPinned": lp} {
		s, err := dev.NewStream()
		require.NoError(t, err)
		require.NoError(t, s.Close())
		for _, size := range []uint64{0, 64} {
			b, err := buffer.Allocate(mr, size, s)
			if !assert.Error(t, err, "%s.Allocate(%d, closed stream)", name, size) {
				require.NoError(t, b.CloseOn(dev.DefaultStream()))
				continue
			}
			assert.ErrorIs(t, err, cuda.ErrClosed)
			assert.Contains(t, err.Error(), name+".Allocate")
		}
	}
}
