package cuda_test

import (
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/loader"
)

// driverGetCurrent looks cuCtxGetCurrent up in the driver library with
// dlsym, as a foreign library's function would be: a plain Proc, with no
// context setter of its own.
func driverGetCurrent(t *testing.T) loader.Proc { return driverProc(t, "cuCtxGetCurrent") }

// Device.Do on every device (the last one included): foreign code inside
// sees the device's primary context; the thread's previous one comes back.
func TestInteropDoEveryDevice(t *testing.T) {
	cudatest.Device(t)
	ds, err := cuda.Devices()
	require.NoError(t, err)
	get := driverGetCurrent(t)
	for _, d := range ds {
		want, err := d.Context()
		require.NoError(t, err)
		var inside uintptr
		require.NoError(t, d.Do(func() error {
			if r := get.Call(uintptr(unsafe.Pointer(&inside))); r != 0 {
				t.Errorf("cuCtxGetCurrent: %d", r)
			}
			return nil
		}))
		assert.Equal(t, want, inside, "%v: its primary context is current inside Do", d)
	}
	// Restored: on a locked thread with no context current, Do leaves none.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	set := driverProc(t, "cuCtxSetCurrent")
	require.Zero(t, set.Call(0))
	last := ds[len(ds)-1]
	require.NoError(t, last.Do(func() error { return nil }))
	var after uintptr = 1
	require.Zero(t, get.Call(uintptr(unsafe.Pointer(&after))))
	assert.Zero(t, after, "Do restored the thread's previous (no) context")
}

func driverProc(t *testing.T, name string) loader.Proc {
	t.Helper()
	path, _, err := cuda.Driver()
	require.NoError(t, err)
	lib, err := loader.OpenLibrary(path)
	require.NoError(t, err)
	t.Cleanup(func() { lib.Close() })
	p, err := lib.Lookup(name)
	require.NoError(t, err)
	return p
}

// A foreign function bound with Device.Foreign runs with its device's
// context current, from many goroutines over every device at once.
func TestInteropForeignEveryDeviceConcurrent(t *testing.T) {
	cudatest.Device(t)
	ds, err := cuda.Devices()
	require.NoError(t, err)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))))
	get := driverGetCurrent(t)
	fs := make([]*cuda.ForeignFunc, len(ds))
	want := make([]uintptr, len(ds))
	for i, d := range ds {
		fs[i], err = d.Foreign(get)
		require.NoError(t, err)
		want[i], err = d.Context()
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := (g + i) % len(ds)
				var c uintptr
				r, err := fs[k].Call(uintptr(unsafe.Pointer(&c)))
				if err != nil || r != 0 || c != want[k] {
					t.Errorf("%v: result %d, error %v, current context %#x, want %#x", ds[k], r, err, c, want[k])
					return
				}
				if i%97 == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
}
