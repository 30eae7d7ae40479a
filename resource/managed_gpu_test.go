package resource_test

// Managed pools and managed buffer operations on a GPU (and, through
// TestManagedTwoDevicesFake, on the fake driver's two devices): Go twins
// of cuda.core's tests/memory/test_managed_ops.py, with the data checked
// at every step: copied in, prefetched to a device and checked by a
// kernel, written by a kernel, prefetched back and compared on the host.

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// managedSize is each test buffer's size: a whole number of host and GPU
// pages (2 MiB covers 4 KiB, 64 KiB and 2 MiB pages), so that buffers
// never share a page and each keeps its own last prefetch location.
const managedSize = 2 * mib

// managedDevice returns device 0 if it can take the location operations
// (managed memory with concurrent managed access), skipping otherwise,
// and if it has room for n bytes of managed memory with plenty to spare
// (other users of the card may need it too).
func managedDevice(t *testing.T, n uint64) *cuda.Device {
	t.Helper()
	dev := cudatest.Device(t)
	f, err := dev.Features()
	require.NoError(t, err)
	if !f.ManagedMemory || !f.ConcurrentManagedAccess {
		t.Skipf("%v lacks managed memory with concurrent managed access", dev)
	}
	free, _, err := dev.MemInfo()
	require.NoError(t, err)
	if free < 8*n {
		t.Skipf("%v has %d bytes free; the test takes %d of managed memory and leaves room", dev, free, n)
	}
	return dev
}

// managedPool makes a ManagedPool closed at the end of the test whose
// memory must be back when the test's cleanups reach it, skipping where
// managed pools are not supported.
func managedPool(t *testing.T, dev *cuda.Device, opts *resource.ManagedPoolOptions) *resource.ManagedPool {
	t.Helper()
	p, err := resource.NewManagedPool(dev, opts)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	devs, err := cuda.Devices()
	require.NoError(t, err)
	checkLeaks(t, p, devs...)
	return p
}

// managedSources are the two kinds of managed memory every operation
// takes: from a ManagedPool, and from cuMemAllocManaged (Managed; the
// "external" buffers of cuda.core's tests).
func managedSources(t *testing.T, dev *cuda.Device) map[string]buffer.MemoryResource {
	t.Helper()
	m, err := resource.NewManaged(dev, nil)
	require.NoError(t, err)
	return map[string]buffer.MemoryResource{"pool": managedPool(t, dev, nil), "external": m}
}

// managedBufs allocates n buffers of managedSize from mr on s, each
// filled with its own pattern (seed+i) copied in from the host, closed at
// the end of the test.
func managedBufs(t *testing.T, mr buffer.MemoryResource, s *cuda.Stream, n int, seed uint32) []*buffer.Buffer {
	t.Helper()
	bufs := make([]*buffer.Buffer, n)
	for i := range bufs {
		b, err := buffer.Allocate(mr, managedSize, s)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, b.Close()) })
		require.NoError(t, buffer.CopyFromHost(b, cudatest.Pattern(managedSize, seed+uint32(i)), s))
		bufs[i] = b
	}
	require.NoError(t, s.Sync())
	return bufs
}

// lastPrefetch reads where b was last prefetched.
func lastPrefetch(t *testing.T, b *buffer.Buffer) cuda.MemLocation {
	t.Helper()
	info, err := resource.QueryManaged(b)
	require.NoError(t, err)
	return info.LastPrefetchLocation
}

// roundTrip proves b's data goes both ways after the bytes with seed were
// copied in: a kernel on k's device checks them once prefetched there,
// writes seed+100, and after a prefetch to the host the CPU reads that.
func roundTrip(t *testing.T, k *cudatest.Kernels, dev *cuda.Device, s *cuda.Stream, b *buffer.Buffer, seed uint32) {
	t.Helper()
	n := b.Size()
	require.NoError(t, resource.Prefetch(b, cuda.DeviceLocation(dev), s))
	k.RequireCheck(t, s, b.Ptr(), n, seed)
	require.NoError(t, k.Write(s, b.Ptr(), n, seed+100))
	require.NoError(t, resource.Prefetch(b, cuda.HostLocation(), s))
	require.NoError(t, s.Sync())
	require.Equal(t, cudatest.Pattern(int(n), seed+100), hostView(b), "host view after the kernel's write")
	got := make([]byte, n)
	require.NoError(t, buffer.CopyToHost(got, b, s))
	require.Equal(t, cudatest.Pattern(int(n), seed+100), got, "copied back to the host")
}

// TestGPUManagedPool: a managed pool's face, its memory round-tripping
// between host and device, each preferred location, and Close.
func TestGPUManagedPool(t *testing.T) {
	dev := managedDevice(t, 8*managedSize)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	mr := managedPool(t, dev, nil)
	assert.True(t, mr.HostAccessible())
	assert.True(t, mr.DeviceAccessible())
	assert.Equal(t, dev.Ordinal(), mr.DeviceID())
	assert.True(t, mr.PreferredLocation().IsZero())
	assert.Contains(t, mr.String(), "ManagedPool(")
	a, err := mr.Attributes()
	require.NoError(t, err)
	assert.Equal(t, ^uint64(0), a.ReleaseThreshold)

	b := managedBufs(t, mr, s, 1, 70)[0]
	info, err := cuda.QueryPointer(b.Ptr())
	require.NoError(t, err)
	assert.True(t, info.Managed, "pool memory is managed memory")
	assert.Equal(t, mr.Pool().Handle(), info.Pool)
	roundTrip(t, k, dev, s, b, 70)

	f, err := dev.Features()
	require.NoError(t, err)
	node := int32(max(f.HostNUMAID, 0))
	for name, tc := range map[string]struct{ loc, want cuda.MemLocation }{
		"device":            {cuda.DeviceLocation(dev), cuda.DeviceLocation(dev)},
		"host":              {cuda.HostLocation(), cuda.HostLocation()},
		"host NUMA":         {cuda.HostNUMALocation(node), cuda.HostNUMALocation(node)},
		"host NUMA current": {cuda.HostNUMACurrentLocation(), cuda.HostNUMALocation(int32(f.HostNUMAID))},
	} {
		t.Run(name, func(t *testing.T) {
			mr := managedPool(t, dev, &resource.ManagedPoolOptions{PreferredLocation: tc.loc})
			assert.Equal(t, tc.want, mr.PreferredLocation())
			assert.Contains(t, mr.String(), "preferred "+tc.want.String())
			b := managedBufs(t, mr, s, 1, 71)[0]
			roundTrip(t, k, dev, s, b, 71)
		})
	}
	t.Run("closed", func(t *testing.T) {
		mr, err := resource.NewManagedPool(dev, nil)
		require.NoError(t, err)
		live, err := mr.Allocate(managedSize, s)
		require.NoError(t, err)
		require.NoError(t, mr.Close())
		assert.True(t, mr.IsClosed())
		_, err = mr.Allocate(64, s)
		require.ErrorIs(t, err, cuda.ErrClosed)
		assert.Contains(t, err.Error(), "ManagedPool.Allocate")
		require.NoError(t, buffer.CopyFromHost(live, cudatest.Pattern(managedSize, 72), s), "a live buffer outlives Close")
		k.RequireCheck(t, s, live.Ptr(), managedSize, 72)
		require.NoError(t, live.Close(), "the last buffer destroys the pool")
		require.NoError(t, mr.Close())
	})
}

// TestGPUCurrentManagedPool: the driver's current managed pool, borrowed
// (cuda.core's ManagedMemoryResource() without options): its memory
// round-trips, and Close leaves the pool to its other users.
func TestGPUCurrentManagedPool(t *testing.T) {
	dev := managedDevice(t, 4*managedSize)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	a, err := resource.CurrentManagedPool(dev)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	devs, err := cuda.Devices()
	require.NoError(t, err)
	checkLeaks(t, a, devs...)
	assert.False(t, a.IsOwned())
	assert.Contains(t, a.String(), "current pool")
	attrs, err := a.Attributes()
	require.NoError(t, err)
	assert.Equal(t, ^uint64(0), attrs.ReleaseThreshold, "a threshold of 0 is raised, as for CurrentDevicePool")

	b := managedBufs(t, a, s, 1, 60)[0]
	info, err := cuda.QueryPointer(b.Ptr())
	require.NoError(t, err)
	assert.True(t, info.Managed)
	assert.Equal(t, a.Pool().Handle(), info.Pool)
	roundTrip(t, k, dev, s, b, 60)

	other, err := resource.CurrentManagedPool(dev)
	require.NoError(t, err)
	assert.Equal(t, a.Pool().Handle(), other.Pool().Handle(), "one current pool")
	require.NoError(t, other.Close())
	c, err := a.Allocate(managedSize, s)
	require.NoError(t, err, "closing one borrower leaves the pool")
	require.NoError(t, buffer.CopyFromHost(c, cudatest.Pattern(managedSize, 61), s))
	roundTrip(t, k, dev, s, c, 61)
	closeBuf(t, c)
	require.NoError(t, s.Sync())
}

// TestGPUManagedBatches: the batched prefetch, discard and
// discard-prefetch over pool and cuMemAllocManaged buffers (cuda.core's
// TestPrefetchBatch, TestDiscardBatch, TestDiscardPrefetchBatch), each
// location read back and the data checked on the device and the host.
func TestGPUManagedBatches(t *testing.T) {
	dev := managedDevice(t, 16*managedSize)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	here, host := cuda.DeviceLocation(dev), cuda.HostLocation()
	for name, mr := range managedSources(t, dev) {
		t.Run(name, func(t *testing.T) {
			t.Run("prefetch same location", func(t *testing.T) {
				bufs := managedBufs(t, mr, s, 3, 80)
				require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{here}, s))
				require.NoError(t, s.Sync())
				for i, b := range bufs {
					assert.Equal(t, here, lastPrefetch(t, b), "buffer %d", i)
					k.RequireCheck(t, s, b.Ptr(), managedSize, 80+uint32(i))
					require.NoError(t, k.Write(s, b.Ptr(), managedSize, 90+uint32(i)))
				}
				require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{host}, s))
				require.NoError(t, s.Sync())
				for i, b := range bufs {
					assert.Equal(t, host, lastPrefetch(t, b), "buffer %d", i)
					require.Equal(t, cudatest.Pattern(managedSize, 90+uint32(i)), hostView(b), "buffer %d", i)
				}
			})
			t.Run("prefetch per buffer", func(t *testing.T) {
				bufs := managedBufs(t, mr, s, 2, 100)
				page := cuda.DevicePtr(os.Getpagesize())
				require.Zero(t, bufs[0].Ptr()%page, "buffer 0 starts a page: the two share none")
				require.Zero(t, bufs[1].Ptr()%page, "buffer 1 starts a page: the two share none")
				require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{host, here}, s))
				require.NoError(t, s.Sync())
				assert.Equal(t, host, lastPrefetch(t, bufs[0]))
				assert.Equal(t, here, lastPrefetch(t, bufs[1]))
				assert.Equal(t, cudatest.Pattern(managedSize, 100), hostView(bufs[0]))
				k.RequireCheck(t, s, bufs[1].Ptr(), managedSize, 101)
			})
			t.Run("discard", func(t *testing.T) {
				bufs := managedBufs(t, mr, s, 3, 110)
				require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{here}, s))
				require.NoError(t, resource.DiscardBatch(bufs, s))
				// Discarded contents are indeterminate: write, then check.
				for i, b := range bufs {
					require.NoError(t, k.Write(s, b.Ptr(), managedSize, 120+uint32(i)))
				}
				require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{host}, s))
				require.NoError(t, s.Sync())
				for i, b := range bufs {
					require.Equal(t, cudatest.Pattern(managedSize, 120+uint32(i)), hostView(b), "buffer %d", i)
				}
			})
			t.Run("discard prefetch", func(t *testing.T) {
				bufs := managedBufs(t, mr, s, 2, 130)
				require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{host}, s))
				require.NoError(t, s.Sync())
				require.NoError(t, resource.DiscardPrefetchBatch(bufs, []cuda.MemLocation{here}, s))
				require.NoError(t, s.Sync())
				for i, b := range bufs {
					assert.Equal(t, here, lastPrefetch(t, b), "buffer %d", i)
					// Discarded: new contents, then both ways.
					require.NoError(t, buffer.CopyFromHost(b, cudatest.Pattern(managedSize, 140+uint32(i)), s))
					roundTrip(t, k, dev, s, b, 140+uint32(i))
				}
			})
		})
	}
}

// TestGPUManagedInstanceOps: Prefetch, Discard and DiscardPrefetch on one
// buffer of each source (cuda.core's test_instance_prefetch,
// test_instance_discard, test_instance_discard_prefetch).
func TestGPUManagedInstanceOps(t *testing.T) {
	dev := managedDevice(t, 8*managedSize)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	here := cuda.DeviceLocation(dev)
	for name, mr := range managedSources(t, dev) {
		t.Run(name, func(t *testing.T) {
			b := managedBufs(t, mr, s, 1, 150)[0]
			assert.True(t, lastPrefetch(t, b).IsZero(), "never prefetched")
			require.NoError(t, resource.Prefetch(b, here, s))
			require.NoError(t, s.Sync())
			assert.Equal(t, here, lastPrefetch(t, b))
			k.RequireCheck(t, s, b.Ptr(), managedSize, 150)

			require.NoError(t, resource.Discard(b, s))
			require.NoError(t, k.Write(s, b.Ptr(), managedSize, 151))
			require.NoError(t, resource.Prefetch(b, cuda.HostLocation(), s))
			require.NoError(t, s.Sync())
			assert.Equal(t, cuda.HostLocation(), lastPrefetch(t, b))
			require.Equal(t, cudatest.Pattern(managedSize, 151), hostView(b))

			require.NoError(t, resource.DiscardPrefetch(b, here, s))
			require.NoError(t, s.Sync())
			assert.Equal(t, here, lastPrefetch(t, b))
			require.NoError(t, buffer.CopyFromHost(b, cudatest.Pattern(managedSize, 152), s))
			roundTrip(t, k, dev, s, b, 152)

			for _, err := range []error{resource.Discard(b, nil), resource.Discard(b, dev.DefaultStream()),
				resource.DiscardPrefetch(b, here, nil)} {
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Contains(t, err.Error(), "legacy default stream")
			}
			err := resource.Prefetch(b, cuda.MemLocation{}, s)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "location is required")
		})
	}
}

// TestGPUManagedFromPointer: managed memory the program got elsewhere,
// wrapped as a borrowed Buffer (cuda.core's test_from_handle), takes
// every operation: the driver says which device serves it.
func TestGPUManagedFromPointer(t *testing.T) {
	dev := managedDevice(t, 4*managedSize)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	m, err := resource.NewManaged(dev, nil)
	require.NoError(t, err)
	owner := managedBufs(t, m, s, 1, 200)[0]
	b := buffer.FromPointer(owner.Ptr(), owner.Size())
	defer closeBuf(t, b) // borrowed: frees nothing
	assert.Nil(t, b.Resource())
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetPreferredLocation, cuda.DeviceLocation(dev)))
	err = resource.PrefetchBatch([]*buffer.Buffer{b}, []cuda.MemLocation{cuda.DeviceLocation(dev)}, s)
	cudatest.SkipIfNotSupported(t, err) // batches need a CUDA 13.0 driver
	require.NoError(t, err)
	require.NoError(t, s.Sync())
	info, err := resource.QueryManaged(b)
	require.NoError(t, err)
	assert.Equal(t, cuda.DeviceLocation(dev), info.PreferredLocation)
	assert.Equal(t, cuda.DeviceLocation(dev), info.LastPrefetchLocation)
	roundTrip(t, k, dev, s, b, 200)
	require.NoError(t, resource.DiscardPrefetch(b, cuda.HostLocation(), s))
	require.NoError(t, s.Sync())
	assert.Equal(t, cuda.HostLocation(), lastPrefetch(t, owner), "one memory, seen through either buffer")
}

// TestGPUManagedBatchRefusals: what the batches refuse, before anything
// is submitted (the buffers' last prefetch locations stay as they were):
// an empty batch, location counts that match neither one nor the
// buffers (cuda.core's test_batch_length_mismatch), memory that is not
// managed, closed buffers, the legacy default stream and missing
// locations. cuda.core's test_batch_rejects_single_buffer has no Go
// twin to run: a *Buffer where a []*Buffer is wanted does not compile;
// a batch of one is a batch.
func TestGPUManagedBatchRefusals(t *testing.T) {
	dev := managedDevice(t, 8*managedSize)
	s := cudatest.Stream(t, dev)
	here, host := cuda.DeviceLocation(dev), cuda.HostLocation()
	mr := managedPool(t, dev, nil)
	bufs := managedBufs(t, mr, s, 2, 160)
	require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{host}, s))
	require.NoError(t, s.Sync())
	pool, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	plain, err := pool.Allocate(managedSize, s)
	require.NoError(t, err)
	defer closeBuf(t, plain)
	closed, err := mr.Allocate(managedSize, s)
	require.NoError(t, err)
	closeBuf(t, closed)

	type batchFn func(bufs []*buffer.Buffer, locs []cuda.MemLocation, s *cuda.Stream) error
	fns := map[string]batchFn{
		"PrefetchBatch":        resource.PrefetchBatch,
		"DiscardPrefetchBatch": resource.DiscardPrefetchBatch,
		"DiscardBatch": func(bufs []*buffer.Buffer, _ []cuda.MemLocation, s *cuda.Stream) error {
			return resource.DiscardBatch(bufs, s)
		},
	}
	for name, fn := range fns {
		t.Run(name, func(t *testing.T) {
			locs := []cuda.MemLocation{here}
			for _, tc := range []struct {
				what string
				bufs []*buffer.Buffer
				locs []cuda.MemLocation
				s    *cuda.Stream
				is   error
				msg  string
			}{
				{"empty", nil, locs, s, cuda.ErrInvalidArgument, "empty batch"},
				{"not managed", []*buffer.Buffer{bufs[0], plain}, locs, s, cuda.ErrInvalidArgument, "not managed memory (allocate it from Managed or ManagedPool) (buffer 1 of 2)"},
				{"nil buffer", []*buffer.Buffer{nil, bufs[1]}, locs, s, cuda.ErrInvalidArgument, "nil buffer (buffer 0 of 2)"},
				{"closed buffer", []*buffer.Buffer{bufs[0], closed}, locs, s, cuda.ErrClosed, "buffer 1 of 2"},
				{"nil stream", bufs, locs, nil, cuda.ErrInvalidArgument, "legacy default stream"},
				{"legacy stream", bufs, locs, dev.DefaultStream(), cuda.ErrInvalidArgument, "legacy default stream"},
			} {
				err := fn(tc.bufs, tc.locs, tc.s)
				require.ErrorIs(t, err, tc.is, tc.what)
				assert.Contains(t, err.Error(), name+": ", tc.what)
				assert.Contains(t, err.Error(), tc.msg, tc.what)
			}
			if name != "DiscardBatch" {
				for _, bad := range [][]cuda.MemLocation{nil, {here, host, here}} {
					err := fn(bufs, bad, s)
					require.ErrorIs(t, err, cuda.ErrInvalidArgument)
					assert.Contains(t, err.Error(), "the length must be 1")
				}
				err := fn(bufs, []cuda.MemLocation{{}}, s)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Contains(t, err.Error(), "location is required")
			}
			// Anything a refused call had queued would show once the
			// stream has drained.
			require.NoError(t, s.Sync())
			for i, b := range bufs {
				assert.Equal(t, host, lastPrefetch(t, b), "buffer %d: nothing was submitted", i)
			}
			require.NoError(t, fn(bufs[:1], locs, s), "a batch of one")
			require.NoError(t, s.Sync())
			require.NoError(t, resource.PrefetchBatch(bufs, []cuda.MemLocation{host}, s))
			require.NoError(t, s.Sync())
		})
	}
}

// TestGPUManagedAdvice: advice set and read back on cuMemAllocManaged
// memory (cuda.core's read_mostly, preferred_location and accessed_by
// round trips, and its advice location checks; it takes external
// buffers for advice because some drivers decline some advice on pool
// memory), the data intact throughout.
func TestGPUManagedAdvice(t *testing.T) {
	dev := managedDevice(t, 4*managedSize)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	m, err := resource.NewManaged(dev, nil)
	require.NoError(t, err)
	b := managedBufs(t, m, s, 1, 170)[0]
	here, host := cuda.DeviceLocation(dev), cuda.HostLocation()
	query := func() cuda.ManagedRange {
		t.Helper()
		info, err := resource.QueryManaged(b)
		require.NoError(t, err)
		return info
	}

	assert.False(t, query().ReadMostly)
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}))
	assert.True(t, query().ReadMostly)
	require.NoError(t, resource.Advise(b, cuda.MemAdviseUnsetReadMostly, cuda.MemLocation{}))
	assert.False(t, query().ReadMostly)

	assert.True(t, query().PreferredLocation.IsZero())
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetPreferredLocation, here))
	assert.Equal(t, here, query().PreferredLocation)
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetPreferredLocation, host))
	assert.Equal(t, host, query().PreferredLocation)
	require.NoError(t, resource.Advise(b, cuda.MemAdviseUnsetPreferredLocation, cuda.MemLocation{}))
	assert.True(t, query().PreferredLocation.IsZero())

	t.Run("host NUMA", func(t *testing.T) {
		// On a machine of one NUMA node the driver may keep a plain host
		// preference: cuda.core skips then too.
		numa := cuda.HostNUMALocation(0)
		if err := resource.Advise(b, cuda.MemAdviseSetPreferredLocation, numa); err != nil {
			t.Skipf("a host NUMA preferred location: %v", err)
		}
		got := query().PreferredLocation
		require.NoError(t, resource.Advise(b, cuda.MemAdviseUnsetPreferredLocation, cuda.MemLocation{}))
		assert.Contains(t, []cuda.MemLocation{numa, host}, got, "a host NUMA node 0 preference reads back as itself, or as the host")
	})

	assert.NotContains(t, query().AccessedBy, here)
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetAccessedBy, here))
	assert.Contains(t, query().AccessedBy, here)
	require.NoError(t, resource.Advise(b, cuda.MemAdviseSetAccessedBy, host))
	assert.Equal(t, []cuda.MemLocation{here, host}, query().AccessedBy)
	for _, bad := range []cuda.MemLocation{cuda.HostNUMALocation(0), cuda.HostNUMACurrentLocation()} {
		err := resource.Advise(b, cuda.MemAdviseSetAccessedBy, bad)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "SetAccessedBy does not support "+bad.String())
	}
	assert.Equal(t, []cuda.MemLocation{here, host}, query().AccessedBy, "a refused advice changes nothing")
	require.NoError(t, resource.Advise(b, cuda.MemAdviseUnsetAccessedBy, here))
	require.NoError(t, resource.Advise(b, cuda.MemAdviseUnsetAccessedBy, host))
	assert.Empty(t, query().AccessedBy)

	roundTrip(t, k, dev, s, b, 170)
}

// TestGPUManagedRejectNonManaged: device memory behind a Buffer is
// refused by every managed operation, with the reason (cuda.core's
// test_managed_memory_operations_reject_non_managed_allocations).
func TestGPUManagedRejectNonManaged(t *testing.T) {
	dev := cudatest.Device(t)
	s := cudatest.Stream(t, dev)
	pool, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	b, err := pool.Allocate(managedSize, s)
	require.NoError(t, err)
	defer closeBuf(t, b)
	_, qerr := resource.QueryManaged(b)
	for name, err := range map[string]error{
		"Advise":          resource.Advise(b, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}),
		"Prefetch":        resource.Prefetch(b, cuda.DeviceLocation(dev), s),
		"DiscardPrefetch": resource.DiscardPrefetch(b, cuda.DeviceLocation(dev), s),
		"Discard":         resource.Discard(b, s),
		"QueryManaged":    qerr,
	} {
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		assert.Contains(t, err.Error(), name+": ", name)
		assert.Contains(t, err.Error(), "is not managed memory", name)
	}
}

// TestGPUManagedTwoDevices: a batch that sends one buffer to each of two
// devices, each checked by a kernel of the device it went to.
func TestGPUManagedTwoDevices(t *testing.T) {
	devs := cudatest.Devices(t, 2)
	managedDevice(t, 4*managedSize)
	for _, d := range devs {
		f, err := d.Features()
		require.NoError(t, err)
		if !f.ConcurrentManagedAccess {
			t.Skipf("%v lacks concurrent managed access", d)
		}
	}
	s := cudatest.Stream(t, devs[0])
	mr := managedPool(t, devs[0], nil)
	bufs := managedBufs(t, mr, s, 2, 180)
	locs := []cuda.MemLocation{cuda.DeviceLocation(devs[0]), cuda.DeviceLocation(devs[1])}
	require.NoError(t, resource.PrefetchBatch(bufs, locs, s))
	require.NoError(t, s.Sync())
	for i, d := range devs {
		assert.Equal(t, locs[i], lastPrefetch(t, bufs[i]))
		cudatest.LoadKernels(t, d).RequireCheck(t, cudatest.Stream(t, d), bufs[i].Ptr(), managedSize, 180+uint32(i))
	}
}
