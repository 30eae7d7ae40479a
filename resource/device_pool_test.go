package resource_test

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// TestDevicePoolData proves both directions on the device: a kernel write
// read back by the host, and a host upload checked by a kernel.
func TestDevicePoolData(t *testing.T) {
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	mr, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	checkLeaks(t, mr, dev)
	for _, n := range []uint64{1, 1000, mib + 7, 16 * mib} {
		b, err := mr.Allocate(n, s)
		require.NoError(t, err)
		require.NoError(t, k.Write(s, b.Ptr(), n, 9))
		require.Equal(t, cudatest.Pattern(int(n), 9), readBack(t, s, b.Ptr(), n), "%d bytes", n)
		upload(t, s, b.Ptr(), cudatest.Pattern(int(n), 21))
		k.RequireCheck(t, s, b.Ptr(), n, 21)
		info, err := cuda.QueryPointer(b.Ptr())
		require.NoError(t, err)
		assert.Equal(t, mr.Pool().Handle(), info.Pool, "memory comes from the wrapped pool")
		closeBuf(t, b)
	}
}

// TestZeroSize: every resource returns an empty buffer for size 0 without
// touching the driver, and ignores Deallocate(0, 0, s).
func TestZeroSize(t *testing.T) {
	dev := cudatest.Device(t)
	checkBufferLeaks(t)
	pool, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	checkLeaks(t, pool, dev)
	before, err := pool.Attributes()
	require.NoError(t, err)
	mrs := map[string]buffer.MemoryResource{"DevicePool": pool}
	if sd, err := resource.NewSyncDevice(dev); assert.NoError(t, err) {
		mrs["SyncDevice"] = sd
	}
	if lp, err := resource.NewLegacyPinned(); assert.NoError(t, err) {
		mrs["LegacyPinned"] = lp
	}
	if m, err := resource.NewManaged(dev, nil); err == nil {
		mrs["Managed"] = m
	}
	if pp, err := resource.NewPinnedPool(nil); err == nil {
		t.Cleanup(func() { assert.NoError(t, pp.Close()) })
		mrs["PinnedPool"] = pp
	}
	for name, mr := range mrs {
		b, err := buffer.Allocate(mr, 0, nil)
		require.NoError(t, err, name)
		assert.Zero(t, b.Ptr(), name)
		assert.Zero(t, b.Size(), name)
		assert.True(t, b.IsOwned(), name)
		require.NoError(t, b.Close(), name)
		require.NoError(t, b.Close(), name)
		require.NoError(t, mr.Deallocate(0, 0, nil), name)
	}
	after, err := pool.Attributes()
	require.NoError(t, err)
	assert.Equal(t, before.UsedMemCurrent, after.UsedMemCurrent)
}

// TestOutOfMemory: asking for four times the device's memory fails with
// an error matching cuda.ErrorOutOfMemory that names the size, and the
// resource keeps working.
func TestOutOfMemory(t *testing.T) {
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	total, err := dev.TotalMemory()
	require.NoError(t, err)
	huge := 4 * total

	pool, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	checkLeaks(t, pool, dev)
	sd, err := resource.NewSyncDevice(dev)
	require.NoError(t, err)
	for _, mr := range []buffer.MemoryResource{pool, sd} {
		_, err = buffer.Allocate(mr, huge, s)
		require.Error(t, err)
		assert.ErrorIs(t, err, cuda.ErrorOutOfMemory)
		assert.Contains(t, err.Error(), strconv.FormatUint(huge, 10))
		assert.Contains(t, err.Error(), ".Allocate")

		b, err := buffer.Allocate(mr, mib, s)
		require.NoError(t, err, "the resource works after an out-of-memory error")
		require.NoError(t, k.Write(s, b.Ptr(), mib, 4))
		k.RequireCheck(t, s, b.Ptr(), mib, 4)
		closeBuf(t, b)
	}
}

// TestDevicePoolOptions: release threshold, initial reserve, maximum size,
// the settable attributes, high-watermark reset and trimming.
func TestDevicePoolOptions(t *testing.T) {
	dev := cudatest.Device(t)
	s := cudatest.Stream(t, dev)

	mr := ownedPool(t, dev, &resource.DevicePoolOptions{InitialReserve: 8 * mib})
	checkLeaks(t, mr, dev)
	a, err := mr.Attributes()
	require.NoError(t, err)
	assert.Equal(t, ^uint64(0), a.ReleaseThreshold, "0 means keep everything")
	assert.GreaterOrEqual(t, a.ReservedMemCurrent, uint64(8*mib), "initial reserve stays in the pool")
	assert.Zero(t, a.UsedMemCurrent)

	require.NoError(t, mr.SetReleaseThreshold(32*mib))
	require.NoError(t, mr.SetReuseAllowOpportunistic(false))
	require.NoError(t, mr.SetReuseFollowEventDependencies(false))
	require.NoError(t, mr.SetReuseAllowInternalDependencies(false))
	a, err = mr.Attributes()
	require.NoError(t, err)
	assert.Equal(t, uint64(32*mib), a.ReleaseThreshold)
	assert.False(t, a.ReuseAllowOpportunistic)
	assert.False(t, a.ReuseFollowEventDependencies)
	assert.False(t, a.ReuseAllowInternalDependencies)
	require.NoError(t, mr.SetReuseAllowOpportunistic(true))
	require.NoError(t, mr.SetReuseFollowEventDependencies(true))
	require.NoError(t, mr.SetReuseAllowInternalDependencies(true))

	b, err := mr.Allocate(4*mib, s)
	require.NoError(t, err)
	closeBuf(t, b)
	require.NoError(t, s.Sync())
	a, err = mr.Attributes()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, a.UsedMemHigh, uint64(4*mib))
	require.NoError(t, mr.ResetHighWatermarks())
	a, err = mr.Attributes()
	require.NoError(t, err)
	assert.Less(t, a.UsedMemHigh, uint64(4*mib), "high watermark reset")

	require.NoError(t, mr.Trim(0))
	a, err = mr.Attributes()
	require.NoError(t, err)
	assert.Zero(t, a.ReservedMemCurrent, "trim to 0 releases all unused memory")

	t.Run("explicit threshold", func(t *testing.T) {
		mr := ownedPool(t, dev, &resource.DevicePoolOptions{ReleaseThreshold: 16 * mib, InitialReserve: 4 * mib})
		a, err := mr.Attributes()
		require.NoError(t, err)
		assert.Equal(t, uint64(16*mib), a.ReleaseThreshold)
	})
	t.Run("max size", func(t *testing.T) {
		mr := ownedPool(t, dev, &resource.DevicePoolOptions{MaxSize: 2 * mib})
		checkLeaks(t, mr, dev)
		_, err := mr.Allocate(64*mib, s)
		require.Error(t, err, "a 2 MiB pool cannot hold 64 MiB")
		assert.Contains(t, err.Error(), strconv.Itoa(64*mib))
		b, err := mr.Allocate(mib, s)
		require.NoError(t, err)
		closeBuf(t, b)
	})
}

// TestDevicePoolClosed: after Close every call but Deallocate returns
// cuda.ErrClosed; buffers allocated before can still be closed (the last
// one destroys the pool); closing a borrowed pool leaves the device's pool
// working.
func TestDevicePoolClosed(t *testing.T) {
	dev := cudatest.Device(t)
	checkBufferLeaks(t)
	mr, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	live, err := mr.Allocate(mib, nil)
	require.NoError(t, err)
	require.NoError(t, mr.Close())
	require.NoError(t, mr.Close(), "Close is idempotent")
	assert.True(t, mr.IsClosed())
	assert.True(t, mr.Pool().IsZero())

	_, err = mr.Allocate(1024, nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "DevicePool.Allocate")
	_, err = mr.Allocate(0, nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = mr.Attributes()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.ErrorIs(t, mr.Trim(0), cuda.ErrClosed)
	assert.ErrorIs(t, mr.SetReleaseThreshold(0), cuda.ErrClosed)
	assert.ErrorIs(t, mr.ResetHighWatermarks(), cuda.ErrClosed)
	assert.ErrorIs(t, mr.SetPeerAccess(), cuda.ErrClosed)
	_, err = mr.PeerAccess()
	assert.ErrorIs(t, err, cuda.ErrClosed)

	require.NoError(t, live.Close(), "buffers outlive their pool resource")
	require.NoError(t, mr.Close(), "the last buffer's Close destroyed the pool")
	require.NoError(t, dev.Sync())

	borrowed, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	require.NoError(t, borrowed.Close())
	again, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	b, err := again.Allocate(1024, nil)
	require.NoError(t, err, "closing a borrowed pool does not destroy it")
	closeBuf(t, b)
}

// TestDevicePoolPeerAccess: a kernel on device 1 writes device 0's pool
// memory once access is granted; revoking shows in the driver's access
// query (no kernel runs without access: a fault would poison the context).
func TestDevicePoolPeerAccess(t *testing.T) {
	devs := cudatest.Devices(t, 2)
	d0, d1 := devs[0], devs[1]
	can, err := d1.CanAccessPeer(d0)
	require.NoError(t, err)
	if !can {
		t.Skipf("%v cannot access %v", d1, d0)
	}
	k0, k1 := cudatest.LoadKernels(t, d0), cudatest.LoadKernels(t, d1)
	s0, s1 := cudatest.Stream(t, d0), cudatest.Stream(t, d1)
	mr := ownedPool(t, d0, &resource.DevicePoolOptions{})
	checkLeaks(t, mr, d0, d1)

	err = mr.SetPeerAccess(d0)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "own device")
	require.ErrorIs(t, mr.SetPeerAccess(nil), cuda.ErrInvalidArgument)
	peers, err := mr.PeerAccess()
	require.NoError(t, err)
	assert.Empty(t, peers)

	require.NoError(t, mr.SetPeerAccess(d1))
	require.NoError(t, mr.SetPeerAccess(d1, d1), "granting again changes nothing")
	peers, err = mr.PeerAccess()
	require.NoError(t, err)
	assert.Equal(t, []int{1}, peers)
	f, err := mr.Pool().Access(deviceLoc(d1))
	require.NoError(t, err)
	assert.Equal(t, cuda.MemAccessProtReadWrite, f)

	const n = 3*mib + 5
	b, err := mr.Allocate(n, s0)
	require.NoError(t, err)
	require.NoError(t, s0.Sync()) // the allocation is complete before d1 uses it
	require.NoError(t, k1.Write(s1, b.Ptr(), n, 17))
	require.NoError(t, s1.Sync())
	k0.RequireCheck(t, s0, b.Ptr(), n, 17)
	assert.Equal(t, cudatest.Pattern(n, 17), readBack(t, s0, b.Ptr(), n))
	closeBuf(t, b)
	require.NoError(t, s0.Sync())

	require.NoError(t, mr.SetPeerAccess())
	peers, err = mr.PeerAccess()
	require.NoError(t, err)
	assert.Empty(t, peers)
	f, err = mr.Pool().Access(deviceLoc(d1))
	require.NoError(t, err)
	assert.Equal(t, cuda.MemAccessProtNone, f)

	t.Run("close revokes", func(t *testing.T) {
		mr, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{})
		require.NoError(t, err)
		require.NoError(t, mr.SetPeerAccess(d1))
		require.NoError(t, mr.Close())
	})

	// cuda.core #1720: two resources on the same (current) pool see each
	// other's changes, because PeerAccess asks the driver.
	t.Run("not cached", func(t *testing.T) {
		a, err := resource.CurrentDevicePool(d0)
		require.NoError(t, err)
		b, err := resource.CurrentDevicePool(d0)
		require.NoError(t, err)
		before, err := a.PeerAccess()
		require.NoError(t, err)
		t.Cleanup(func() {
			var ds []*cuda.Device
			for _, o := range before {
				d, err := cuda.GetDevice(o)
				require.NoError(t, err)
				ds = append(ds, d)
			}
			assert.NoError(t, a.SetPeerAccess(ds...), "restore the current pool's access")
		})
		require.NoError(t, a.SetPeerAccess(d1))
		peers, err := b.PeerAccess()
		require.NoError(t, err)
		assert.Contains(t, peers, 1)
		require.NoError(t, a.SetPeerAccess())
		peers, err = b.PeerAccess()
		require.NoError(t, err)
		assert.Empty(t, peers)
		// A change made on the driver pool itself shows too, and
		// SetPeerAccess computes its change against it.
		rw := cuda.MemAccessDesc{Location: deviceLoc(d1), Flags: cuda.MemAccessProtReadWrite}
		require.NoError(t, b.Pool().SetAccess(rw))
		peers, err = a.PeerAccess()
		require.NoError(t, err)
		assert.Equal(t, []int{1}, peers)
		require.NoError(t, a.SetPeerAccess())
		f, err := b.Pool().Access(deviceLoc(d1))
		require.NoError(t, err)
		assert.Equal(t, cuda.MemAccessProtNone, f, "revoked though a never granted it")
	})
}

// TestDefault: the automatic default, replacing it, and concurrent use.
func TestDefault(t *testing.T) {
	dev := cudatest.Device(t)
	orig, err := resource.Default(dev)
	require.NoError(t, err)
	f, err := dev.Features()
	require.NoError(t, err)
	if f.MemoryPools {
		require.IsType(t, &resource.DevicePool{}, orig)
		// A closed automatic default is replaced (closing it destroys
		// nothing: it borrows the current pool).
		require.NoError(t, orig.(*resource.DevicePool).Close())
		next, err := resource.Default(dev)
		require.NoError(t, err)
		assert.NotSame(t, orig, next)
		assert.False(t, next.(*resource.DevicePool).IsClosed())
		orig = next
	} else {
		require.IsType(t, &resource.SyncDevice{}, orig)
	}
	t.Cleanup(func() { assert.NoError(t, resource.SetDefault(dev, orig)) })

	var wg sync.WaitGroup
	got := make([]buffer.MemoryResource, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mr, err := resource.Default(dev)
			assert.NoError(t, err)
			got[i] = mr
		}()
	}
	wg.Wait()
	for _, mr := range got {
		assert.Same(t, orig, mr)
	}

	sd, err := resource.NewSyncDevice(dev)
	require.NoError(t, err)
	require.NoError(t, resource.SetDefault(dev, sd))
	mr, err := resource.Default(dev)
	require.NoError(t, err)
	assert.Same(t, sd, mr)
	b, err := buffer.Allocate(mr, 1024, nil)
	require.NoError(t, err)
	closeBuf(t, b)

	err = resource.SetDefault(dev, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "SetDefault")
	var nilPool *resource.DevicePool
	require.ErrorIs(t, resource.SetDefault(dev, nilPool), cuda.ErrInvalidArgument)
	lp, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	require.NoError(t, resource.SetDefault(dev, lp), "a resource bound to no device may be any device's default")

	// A closed resource is refused: Default would hand it out, and every
	// Allocate through it would fail.
	closed, err := resource.NewSubAllocator(lp, nil)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	err = resource.SetDefault(dev, closed)
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "SetDefault")
	mr, err = resource.Default(dev)
	require.NoError(t, err)
	assert.Same(t, lp, mr, "a refused SetDefault leaves the default as it was")

	if devs, err := cuda.Devices(); err == nil && len(devs) > 1 {
		other, err := resource.NewSyncDevice(devs[1])
		require.NoError(t, err)
		err = resource.SetDefault(dev, other)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "GPU 1")
	}
}
