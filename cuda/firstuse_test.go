package cuda

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/loader"
)

// Issue 6 (fault sweep, first use k=1..3): a failed cuDeviceGetCount or
// cuDeviceGet on the first call was cached by a sync.OnceValues, so every
// later device lookup of the process failed with it. A failure must be
// retried on the next call; a success must be kept (devices are
// singletons).
func TestDeviceTableRetriesFailure(t *testing.T) {
	var calls atomic.Int32
	saved := deviceCount
	t.Cleanup(func() { deviceCount = saved })
	deviceCount = func(*driver) (int32, uintptr) {
		if calls.Add(1) == 1 {
			return 0, uintptr(ErrorOutOfMemory) // the first call fails
		}
		return 0, 0 // a driver with no device: an empty, successful list
	}
	drv := &driver{}
	var tab deviceTable
	load := func() (*driver, error) { return drv, nil }

	_, err := tab.get(load)
	require.ErrorIs(t, err, ErrorOutOfMemory)

	ds, err := tab.get(load)
	require.NoError(t, err, "the failure is not kept: the next call enumerates again")
	assert.Empty(t, ds)
	assert.EqualValues(t, 2, calls.Load())

	_, err = tab.get(load)
	require.NoError(t, err)
	assert.EqualValues(t, 2, calls.Load(), "a success is kept: no driver call on later lookups")

	// A failed load is passed through and not kept either.
	var tab2 deviceTable
	_, err = tab2.get(func() (*driver, error) { return nil, ErrNoDriver })
	assert.ErrorIs(t, err, ErrNoDriver)
	_, err = tab2.get(load)
	assert.NoError(t, err)
}

// The same against the fake driver library: cuDeviceGet failing for
// device 1 fails the lookup, the next lookup succeeds with both devices,
// and later lookups return the same *Device values whatever the driver
// does meanwhile.
func TestDeviceTableRetriesFailureFakeDriver(t *testing.T) {
	if _, err := loader.OpenLibrary("libc.so.6"); err != nil {
		t.Skipf("no dlopen here: %v", err)
	}
	path := fakeDriverPath(t)
	lib, err := loader.OpenLibrary(path)
	require.NoError(t, err)
	setCount, err := lib.Lookup("fake_set_device_count")
	require.NoError(t, err)
	setLimit, err := lib.Lookup("fake_set_device_get_limit")
	require.NoError(t, err)
	drv, err := openDriver(path)
	require.NoError(t, err)
	load := func() (*driver, error) { return drv, nil }

	setCount.Call(2)
	setLimit.Call(1)
	var tab deviceTable
	_, err = tab.get(load)
	require.ErrorIs(t, err, ErrorInvalidDevice)
	assert.Contains(t, err.Error(), "device 1")
	assert.Contains(t, err.Error(), "cuDeviceGet")

	setLimit.Call(1 << 20)
	ds, err := tab.get(load)
	require.NoError(t, err)
	require.Len(t, ds, 2)

	setLimit.Call(0) // every cuDeviceGet would fail now: nothing asks
	again, err := tab.get(load)
	require.NoError(t, err)
	require.Len(t, again, 2)
	assert.Same(t, ds[0], again[0])
	assert.Same(t, ds[1], again[1])
}

// Many goroutines on a first use whose enumeration fails a few times:
// each gets the error or the one list, and all agree on the list once it
// exists (run under -race).
func TestDeviceTableConcurrent(t *testing.T) {
	var calls atomic.Int32
	saved := deviceCount
	t.Cleanup(func() { deviceCount = saved })
	deviceCount = func(*driver) (int32, uintptr) {
		if calls.Add(1) <= 3 {
			return 0, uintptr(ErrorOutOfMemory)
		}
		return 0, 0
	}
	var tab deviceTable
	drv := &driver{}
	load := func() (*driver, error) { return drv, nil }
	var wg sync.WaitGroup
	var fails, oks atomic.Int32
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ds, err := tab.get(load)
				if err != nil {
					if !errors.Is(err, ErrorOutOfMemory) {
						t.Errorf("unexpected error %v", err)
						return
					}
					fails.Add(1)
					continue
				}
				if ds == nil {
					t.Error("nil list without an error")
				}
				oks.Add(1)
				return
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 3, fails.Load(), "each failure is seen by exactly one caller")
	assert.EqualValues(t, 64, oks.Load())
	assert.EqualValues(t, 4, calls.Load(), "enumerated until the first success, then never again")
}

// Issue 6 (fault sweep, first use k=14): a failed cuDevicePrimaryCtxRetain
// was cached by the device's sync.Once, so every later call needing a
// context failed with it. A failure must be retried; a success kept.
func TestContextRetainRetriesFailure(t *testing.T) {
	var calls atomic.Int32
	saved := retainPrimary
	t.Cleanup(func() { retainPrimary = saved })
	retainPrimary = func(d *Device) (uintptr, error) {
		if calls.Add(1) == 1 {
			return 0, &OpError{Op: "cuDevicePrimaryCtxRetain", Err: ErrorOutOfMemory}
		}
		return 0x77, nil
	}
	d := &Device{drv: &driver{}}
	_, err := d.Context()
	require.ErrorIs(t, err, ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "cuDevicePrimaryCtxRetain")

	c, err := d.Context()
	require.NoError(t, err, "the failure is not kept: the next call retains again")
	assert.Equal(t, uintptr(0x77), c)
	c, err = d.contextFor("Device.MemInfo")
	require.NoError(t, err)
	assert.Equal(t, uintptr(0x77), c)
	assert.EqualValues(t, 2, calls.Load(), "retained once, then kept")
}

// Many goroutines asking for a context while the first retains fail: the
// context is retained exactly once (a second retain would leak a
// reference), and everyone sees the same handle (run under -race).
func TestContextRetainConcurrent(t *testing.T) {
	var calls, retained atomic.Int32
	saved := retainPrimary
	t.Cleanup(func() { retainPrimary = saved })
	retainPrimary = func(d *Device) (uintptr, error) {
		if calls.Add(1) <= 5 {
			return 0, &OpError{Op: "cuDevicePrimaryCtxRetain", Err: ErrorOutOfMemory}
		}
		retained.Add(1)
		return 0x99, nil
	}
	d := &Device{drv: &driver{}}
	var wg sync.WaitGroup
	var fails atomic.Int32
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := d.context()
				if err != nil {
					fails.Add(1)
					continue
				}
				if c != 0x99 {
					t.Errorf("context %#x, want 0x99", c)
				}
				return
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 5, fails.Load())
	assert.EqualValues(t, 1, retained.Load(), "one successful retain in all")
	assert.EqualValues(t, 6, calls.Load())
}
