package resource_test

// Go twins of cuda.core's tests/memory/test_resource_live_count.py.
// cuda.core counts the MemoryResource objects alive in the process; a Go
// resource holds what it allocated from its constructor to its Close, and
// that is what these twins count: the live allocations its adaptors see
// (Statistics, Tracking, SubAllocator), the pool's used memory as the
// driver reports it, and, over the fake driver, the driver's own counts of
// pools and allocations. Each must return to where it began.

import (
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
)

// driverCounts snapshots the fake driver's counts when it is the driver
// loaded, so a test can assert with the returned func that they came back
// (it does nothing on a real driver). dev's primary context is retained
// first: it stays retained for the process.
func driverCounts(t *testing.T, dev *cuda.Device) func() {
	t.Helper()
	require.NoError(t, dev.Sync())
	path, _, err := cuda.Driver()
	require.NoError(t, err)
	if !fakecuda.Is(path) {
		return func() {}
	}
	fk, err := fakecuda.Open(path)
	require.NoError(t, err)
	base := fk.Snapshot()
	return func() {
		t.Helper()
		assert.Empty(t, fk.Snapshot().Diff(base), "the fake driver's counts are back")
	}
}

// countedAlloc allocates from st, writes a pattern and checks it on the
// device, and asserts st counts one more live allocation.
func countedAlloc(t *testing.T, dev *cuda.Device, st *resource.Statistics, size uint64) *buffer.Buffer {
	t.Helper()
	before := st.Stats().CurrentCount
	b, err := st.Allocate(size, nil)
	require.NoError(t, err)
	k := cudatest.LoadKernels(t, dev)
	s := dev.DefaultStream()
	require.NoError(t, k.Write(s, b.Ptr(), size, 9))
	k.RequireCheck(t, s, b.Ptr(), size, 9)
	assert.Equal(t, before+1, st.Stats().CurrentCount, "counted while live")
	return b
}

// test_new_resource_is_counted_until_freed, for each kind of resource:
// an allocation is counted while live, uncounted once closed, and closing
// the resource leaves the pool's and the driver's counts where they were.
func TestNewResourceIsCountedUntilFreed(t *testing.T) {
	dev := cudatest.Device(t)
	for _, tc := range []struct {
		name string
		make func(t *testing.T) (buffer.MemoryResource, func() error)
	}{
		{"DevicePool", func(t *testing.T) (buffer.MemoryResource, func() error) {
			p, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
			require.NoError(t, err)
			return p, p.Close
		}},
		{"SyncDevice", func(t *testing.T) (buffer.MemoryResource, func() error) {
			p, err := resource.NewSyncDevice(dev)
			require.NoError(t, err)
			return p, func() error { return nil }
		}},
		{"SubAllocator", func(t *testing.T) (buffer.MemoryResource, func() error) {
			p, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
			require.NoError(t, err)
			a, err := resource.NewSubAllocator(p, nil)
			require.NoError(t, err)
			return a, func() error {
				assert.Zero(t, a.Stats().Allocations, "the sub-allocator's own count")
				if err := a.Close(); err != nil {
					return err
				}
				return p.Close()
			}
		}},
		{"Tracking", func(t *testing.T) (buffer.MemoryResource, func() error) {
			p, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
			require.NoError(t, err)
			tr := resource.NewTracking(p, nil)
			return tr, func() error {
				assert.Empty(t, tr.Live(), "the tracker's live allocations")
				return p.Close()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			back := driverCounts(t, dev)
			mr, closeMR := tc.make(t)
			st := resource.NewStatistics(mr)
			b := countedAlloc(t, dev, st, 64<<10)
			require.NoError(t, b.Close())
			require.NoError(t, dev.Sync())
			assert.Zero(t, st.Stats().CurrentCount, "uncounted once closed")
			assert.Equal(t, uint64(1), st.Stats().TotalCount)
			require.NoError(t, closeMR())
			back()
		})
	}
}

// test_resource_in_cycle_stays_counted_until_collect: a Buffer lost
// without Close (it and its resources reach each other) stays counted
// until the garbage collector finds it; the safety net then frees it and
// the count is back, the pool's used memory with it.
func TestResourceInCycleStaysCountedUntilCollect(t *testing.T) {
	dev := cudatest.Device(t)
	back := driverCounts(t, dev)
	pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	st := resource.NewStatistics(pool)
	leaks, kept := buffer.Leaks(), buffer.LeaksKept()
	// One P, and a collection first: the lost Buffer starts a slab of its
	// own, so that no Buffer still reachable from another test keeps its
	// slab (the net's unit) alive.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	runtime.GC()
	func() {
		b := countedAlloc(t, dev, st, 64<<10)
		_ = b // lost: never closed
	}()
	assert.Equal(t, uint64(1), st.Stats().CurrentCount, "counted while only the collector can find it")
	for range 300 {
		if st.Stats().CurrentCount == 0 {
			break
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Zero(t, st.Stats().CurrentCount, "the safety net freed it")
	assert.Equal(t, leaks+1, buffer.Leaks(), "counted as a leak")
	assert.Equal(t, kept, buffer.LeaksKept(), "its memory given back")
	require.NoError(t, dev.Sync())
	a, err := pool.Attributes()
	require.NoError(t, err)
	assert.Zero(t, a.UsedMemCurrent, "the pool's used memory is back")
	require.NoError(t, pool.Close())
	back()
}

// userResource is a MemoryResource of the user's own, over a pool.
type userResource struct {
	up         *resource.DevicePool
	mu         sync.Mutex
	live, made int
}

func (u *userResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	p, s, err := u.up.AllocatePtr(size, s)
	if err == nil {
		u.mu.Lock()
		u.live++
		u.made++
		u.mu.Unlock()
	}
	return p, s, err
}

func (u *userResource) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	err := u.up.Deallocate(p, size, s)
	if err == nil {
		u.mu.Lock()
		u.live--
		u.mu.Unlock()
	}
	return err
}

func (u *userResource) DeviceAccessible() bool { return true }
func (u *userResource) HostAccessible() bool   { return false }
func (u *userResource) DeviceID() int          { return u.up.DeviceID() }

// test_subclass_with_init_args_is_counted: a resource type of the user's
// own, built with its own fields, is counted like the package's, and its
// own count agrees.
func TestSubclassWithInitArgsIsCounted(t *testing.T) {
	dev := cudatest.Device(t)
	back := driverCounts(t, dev)
	pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	u := &userResource{up: pool}
	st := resource.NewStatistics(u)
	b := countedAlloc(t, dev, st, 4096)
	assert.Equal(t, 1, u.live)
	require.NoError(t, b.Close())
	assert.Zero(t, st.Stats().CurrentCount)
	assert.Zero(t, u.live)
	assert.Equal(t, 1, u.made)
	require.NoError(t, pool.Close())
	back()
}

// test_cython_subclass_wrapper_is_counted: the non-owning DevicePool over
// the device's current pool is counted and uncounted like any resource,
// and its Close leaves the pool it borrowed in place.
func TestCythonSubclassWrapperIsCounted(t *testing.T) {
	dev := cudatest.Device(t)
	back := driverCounts(t, dev)
	mr, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	require.False(t, mr.IsOwned())
	st := resource.NewStatistics(mr)
	b := countedAlloc(t, dev, st, 4096)
	require.NoError(t, b.Close())
	assert.Zero(t, st.Stats().CurrentCount)
	require.NoError(t, mr.Close())
	cur, err := dev.CurrentMemPool()
	require.NoError(t, err)
	again, err := resource.CurrentDevicePool(dev)
	require.NoError(t, err)
	assert.Equal(t, cur.Handle(), again.Pool().Handle(), "the borrowed pool lives on")
	require.NoError(t, again.Close())
	require.NoError(t, dev.Sync())
	back()
}

// test_concurrent_construct_and_drop_returns_to_start: goroutines each
// make resources (an owned pool, a sub-allocator over it), allocate and
// free through a Statistics shared by all, and close them; afterwards
// every count is where it began.
func TestConcurrentConstructAndDropReturnsToStart(t *testing.T) {
	concurrentConstructAndDrop(t, false)
}

// TestConcurrentConstructAndDropLegacyStream is the same on the legacy
// default stream (nil). On an H200 it hung in the driver: every goroutine
// in cuCtxSynchronize (a pool's Close waiting for the device),
// cuStreamSynchronize or cuMemFreeAsync, none holding a lock of
// cudamem's. It runs only with CUDAMEM_REPRO_LEGACY_HANG=1.
func TestConcurrentConstructAndDropLegacyStream(t *testing.T) {
	if os.Getenv("CUDAMEM_REPRO_LEGACY_HANG") != "1" {
		t.Skip("set CUDAMEM_REPRO_LEGACY_HANG=1 to run (it hung in the driver on a real GPU)")
	}
	concurrentConstructAndDrop(t, true)
}

// concurrentConstructAndDrop makes and drops pools, sub-allocators and
// statistics from eight goroutines, each on a stream of its own (or all
// on the legacy default stream), and requires every count back where it
// started.
func concurrentConstructAndDrop(t *testing.T, legacy bool) {
	dev := cudatest.Device(t)
	back := driverCounts(t, dev)
	var total sync.Mutex
	var made, freed int
	const goroutines, rounds = 8, 25
	var wg sync.WaitGroup
	var streams []*cuda.Stream
	for range goroutines {
		var s *cuda.Stream
		if !legacy {
			var err error
			s, err = dev.NewStream()
			require.NoError(t, err)
			streams = append(streams, s)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
				if !assert.NoError(t, err) {
					return
				}
				a, err := resource.NewSubAllocator(pool, nil)
				if !assert.NoError(t, err) {
					assert.NoError(t, pool.Close())
					return
				}
				st := resource.NewStatistics(a)
				b, err := st.Allocate(4096, s)
				if assert.NoError(t, err) {
					total.Lock()
					made++
					total.Unlock()
					if assert.NoError(t, b.Close()) {
						total.Lock()
						freed++
						total.Unlock()
					}
				}
				assert.Zero(t, st.Stats().CurrentCount)
				assert.NoError(t, a.Close())
				assert.NoError(t, pool.Close())
			}
		}()
	}
	wg.Wait()
	for _, s := range streams {
		require.NoError(t, s.Close())
	}
	assert.Equal(t, goroutines*rounds, made)
	assert.Equal(t, made, freed)
	require.NoError(t, dev.Sync())
	back()
}

// The twins over the fake driver's devices (in a child process), where the
// driver's own counts of pools and allocations are checked too.
func TestResourceLiveCountFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestNewResourceIsCountedUntilFreed", "TestResourceInCycleStaysCountedUntilCollect",
		"TestSubclassWithInitArgsIsCounted", "TestCythonSubclassWrapperIsCounted", "TestConcurrentConstructAndDropReturnsToStart")
}
