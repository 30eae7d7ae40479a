package resource_test

// Go twins of cuda.core's test_memory.py tests of DeviceMemoryResource
// (commit f9df16f), named after the originals.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// test_device_memory_resource_initialization[use_device_object]: the
// resource over the current pool, made from a device object or an ordinal.
func TestDeviceMemoryResourceInitialization(t *testing.T) {
	dev := cudatest.Device(t)
	for _, tc := range []struct {
		name string
		dev  func(t *testing.T) *cuda.Device
	}{
		{"device object", func(*testing.T) *cuda.Device { return dev }},
		{"ordinal", func(t *testing.T) *cuda.Device {
			d, err := cuda.GetDevice(dev.Ordinal())
			require.NoError(t, err)
			return d
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr, err := resource.CurrentDevicePool(tc.dev(t))
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, mr.Close()) })
			checkLeaks(t, mr, dev)

			assert.Equal(t, dev.Ordinal(), mr.DeviceID())
			assert.Same(t, dev, mr.Device())
			assert.True(t, mr.DeviceAccessible())
			assert.False(t, mr.HostAccessible())
			assert.False(t, mr.IsIPCEnabled())
			assert.False(t, mr.IsOwned(), "nil options borrow the current pool")
			cur, err := dev.CurrentMemPool()
			require.NoError(t, err)
			assert.Equal(t, cur.Handle(), mr.Pool().Handle())
			a, err := mr.Attributes()
			require.NoError(t, err)
			assert.NotZero(t, a.ReleaseThreshold, "a zero release threshold is raised")

			b, err := mr.Allocate(1024, nil)
			require.NoError(t, err)
			assert.Equal(t, uint64(1024), b.Size())
			assert.NotZero(t, b.Ptr())
			assert.Equal(t, mr, b.Resource())
			assert.Equal(t, dev.Ordinal(), b.Resource().DeviceID())
			closeBuf(t, b)
		})
	}
}

// test_mempool: an owned 2 MiB pool; properties, allocate/close, distinct
// allocations, allocation on a stream, and a copy within the pool. The
// IPC-only checks of the original belong to package ipc.
func TestMempool(t *testing.T) {
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	mr := ownedPool(t, dev, &resource.DevicePoolOptions{MaxSize: 2 * mib})
	checkLeaks(t, mr, dev)

	// Properties.
	assert.Equal(t, dev.Ordinal(), mr.DeviceID())
	assert.True(t, mr.DeviceAccessible())
	assert.False(t, mr.HostAccessible())
	assert.True(t, mr.IsOwned())
	assert.False(t, mr.IsIPCEnabled())
	assert.False(t, mr.Pool().IsZero())

	// Allocate, then close.
	b, err := mr.Allocate(1024, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(1024), b.Size())
	assert.Same(t, dev.DefaultStream(), b.Stream(), "nil stream means the device's default stream")
	closeBuf(t, b)
	assert.Zero(t, b.Ptr())

	// Two allocations differ.
	b1, err := mr.Allocate(1024, nil)
	require.NoError(t, err)
	b2, err := mr.Allocate(2048, nil)
	require.NoError(t, err)
	assert.NotEqual(t, b1.Ptr(), b2.Ptr())
	closeBuf(t, b1)
	closeBuf(t, b2)

	// Allocation on a stream, written by the device and read by the host.
	s := cudatest.Stream(t, dev)
	src, err := mr.Allocate(1024, s)
	require.NoError(t, err)
	assert.Same(t, s, src.Stream())
	require.NoError(t, k.Write(s, src.Ptr(), 1024, 3))
	assert.Equal(t, cudatest.Pattern(1024, 3), readBack(t, s, src.Ptr(), 1024))

	// Copy within the pool, checked on the device.
	dst, err := mr.Allocate(1024, s)
	require.NoError(t, err)
	require.NoError(t, s.MemcpyAsync(dst.Ptr(), src.Ptr(), 1024))
	k.RequireCheck(t, s, dst.Ptr(), 1024, 3)
	closeBuf(t, src)
	closeBuf(t, dst)
}

// test_mempool_attributes[ipc_enabled × property]: every attribute reads,
// *_current does not decrease across an allocation, *_high >= *_current.
func TestMempoolAttributes(t *testing.T) {
	dev := cudatest.Device(t)
	type kind int
	const (
		flag kind = iota
		setting
		current
		high
	)
	attrs := []struct {
		name string
		kind kind
		get  func(resource.PoolAttributes) uint64
		cur  func(resource.PoolAttributes) uint64 // for high: the matching current
	}{
		{"reuse_follow_event_dependencies", flag, func(a resource.PoolAttributes) uint64 { return b2u(a.ReuseFollowEventDependencies) }, nil},
		{"reuse_allow_opportunistic", flag, func(a resource.PoolAttributes) uint64 { return b2u(a.ReuseAllowOpportunistic) }, nil},
		{"reuse_allow_internal_dependencies", flag, func(a resource.PoolAttributes) uint64 { return b2u(a.ReuseAllowInternalDependencies) }, nil},
		{"release_threshold", setting, func(a resource.PoolAttributes) uint64 { return a.ReleaseThreshold }, nil},
		{"reserved_mem_current", current, func(a resource.PoolAttributes) uint64 { return a.ReservedMemCurrent }, nil},
		{"reserved_mem_high", high, func(a resource.PoolAttributes) uint64 { return a.ReservedMemHigh },
			func(a resource.PoolAttributes) uint64 { return a.ReservedMemCurrent }},
		{"used_mem_current", current, func(a resource.PoolAttributes) uint64 { return a.UsedMemCurrent }, nil},
		{"used_mem_high", high, func(a resource.PoolAttributes) uint64 { return a.UsedMemHigh },
			func(a resource.PoolAttributes) uint64 { return a.UsedMemCurrent }},
	}
	for _, ipc := range []bool{false, true} {
		name := "ipc=false"
		if ipc {
			name = "ipc=true"
		}
		t.Run(name, func(t *testing.T) {
			mr := ownedPool(t, dev, &resource.DevicePoolOptions{MaxSize: 2 * mib, IPC: ipc})
			checkLeaks(t, mr, dev)
			assert.Equal(t, ipc, mr.IsIPCEnabled())
			for _, at := range attrs {
				t.Run(at.name, func(t *testing.T) {
					syncAll(t, dev) // earlier frees have completed
					before, err := mr.Attributes()
					require.NoError(t, err)
					b, err := mr.Allocate(1024, nil)
					require.NoError(t, err)
					after, err := mr.Attributes()
					require.NoError(t, err)
					closeBuf(t, b)
					switch at.kind {
					case flag:
						assert.LessOrEqual(t, at.get(after), uint64(1))
						assert.Equal(t, uint64(1), at.get(after), "reuse flags default to enabled")
					case setting:
						assert.Equal(t, ^uint64(0), at.get(after), "owned pools keep freed memory by default")
					case current:
						assert.GreaterOrEqual(t, at.get(after), at.get(before), "current must not decrease after Allocate(1024)")
						assert.GreaterOrEqual(t, at.get(after), uint64(1024))
					case high:
						assert.GreaterOrEqual(t, at.get(after), at.cur(after))
					}
				})
			}
		})
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// test_mempool_attributes_ownership: attributes after the resource is
// closed. cuda.core raised "expired" at f9df16f and later kept the pool
// alive; here Close destroys an owned pool, so reading its attributes
// afterwards is an error matching cuda.ErrClosed, and stays one after a
// new pool is created (which may reuse the driver's handle).
func TestMempoolAttributesOwnership(t *testing.T) {
	dev := cudatest.Device(t)
	mr, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{MaxSize: 2 * mib})
	require.NoError(t, err)
	_, err = mr.Attributes()
	require.NoError(t, err)
	require.NoError(t, mr.Close())
	_, err = mr.Attributes()
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "DevicePool.Attributes")

	other := ownedPool(t, dev, &resource.DevicePoolOptions{MaxSize: 2 * mib})
	_, err = mr.Attributes()
	require.ErrorIs(t, err, cuda.ErrClosed)
	_, err = other.Attributes()
	require.NoError(t, err)
}
