package cuda

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/loader"
)

// withDeviceCount makes enumerate see a driver reporting n devices.
func withDeviceCount(t *testing.T, n int32) {
	t.Helper()
	saved := deviceCount
	deviceCount = func(*driver) (int32, uintptr) { return n, 0 }
	t.Cleanup(func() { deviceCount = saved })
}

// A driver reporting a negative device count made every later call panic
// (make with a negative length inside the sync.OnceValues, which re-panics
// on every call). It must be an error instead, and so must an absurd count.
func TestNegativeDeviceCountIsAnError(t *testing.T) {
	for _, n := range []int32{-1, -1 << 31, maxDevices + 1, 1<<31 - 1} {
		withDeviceCount(t, n)
		var devs []*Device
		var err error
		require.NotPanics(t, func() { devs, err = enumerate(&driver{}) }, "count %d", n)
		require.Error(t, err, "count %d", n)
		assert.Nil(t, devs)
		assert.ErrorIs(t, err, ErrorUnknown)
		assert.Contains(t, err.Error(), "cuDeviceGetCount")
		assert.Contains(t, err.Error(), "reported")
	}
	// A driver that says 0 devices is believed: an empty list.
	withDeviceCount(t, 0)
	devs, err := enumerate(&driver{})
	require.NoError(t, err)
	assert.Empty(t, devs)
}

// fakeDriverPath builds loader/testdata/fakecuda.c into a shared library,
// skipping without a C compiler (as the loader's tests do).
func fakeDriverPath(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if os.Getenv("CUDAMEM_REQUIRE_CC") != "" {
			t.Fatalf("no C compiler (%s): %v", cc, err)
		}
		t.Skipf("fake driver needs a C compiler (%s): %v", cc, err)
	}
	out := filepath.Join(t.TempDir(), "libfakecuda.so")
	b, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", out, "../loader/testdata/fakecuda.c").CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}

// TestFakeDriverDeviceCounts runs the real enumeration against the fake
// driver with the counts a broken driver could report.
func TestFakeDriverDeviceCounts(t *testing.T) {
	if _, err := loader.OpenLibrary("libc.so.6"); err != nil {
		t.Skipf("no dlopen here: %v", err)
	}
	path := fakeDriverPath(t)
	lib, err := loader.OpenLibrary(path)
	require.NoError(t, err)
	set, err := lib.Lookup("fake_set_device_count")
	require.NoError(t, err)
	drv, err := openDriver(path)
	require.NoError(t, err)

	for _, tc := range []struct {
		n    int32
		want int // -1: an error
	}{{2, 2}, {0, 0}, {-1, -1}, {-7, -1}, {maxDevices + 1, -1}} {
		set.Call(uintptr(uint32(tc.n)))
		var devs []*Device
		require.NotPanics(t, func() { devs, err = enumerate(drv) }, "count %d", tc.n)
		if tc.want < 0 {
			assert.Error(t, err, "count %d", tc.n)
			assert.ErrorIs(t, err, ErrorUnknown, "count %d", tc.n)
			continue
		}
		require.NoError(t, err, "count %d", tc.n)
		require.Len(t, devs, tc.want)
		for i, d := range devs {
			assert.Equal(t, i, d.Ordinal())
			name, err := d.Name()
			require.NoError(t, err)
			assert.LessOrEqual(t, len(name), 256, "a name without a terminating NUL stays within the buffer")
		}
	}

	// A driver failing cuDeviceGet mid-way: an error naming the device.
	set.Call(5)
	fail, err := lib.Lookup("fake_set_device_get_limit")
	require.NoError(t, err)
	fail.Call(3)
	_, err = enumerate(drv)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "device 3")
	assert.True(t, errors.Is(err, ErrorInvalidDevice), "%v", err)
}

// Numbers from the driver that callers use as sizes, alignments or
// indexes are bounded: a zero granularity, a negative NUMA node.
func TestFakeDriverBoundsNumbers(t *testing.T) {
	if _, err := loader.OpenLibrary("libc.so.6"); err != nil {
		t.Skipf("no dlopen here: %v", err)
	}
	path := fakeDriverPath(t)
	lib, err := loader.OpenLibrary(path)
	require.NoError(t, err)
	drv, err := openDriver(path)
	require.NoError(t, err)
	d := &Device{drv: drv}
	d.setContext(0x1234)

	setG, err := lib.Lookup("fake_set_granularity")
	require.NoError(t, err)
	for _, g := range []uint64{0, 3, 3 << 20} {
		setG.Call(uintptr(g))
		_, err := d.AllocationGranularity(&MemAllocationProp{}, MemAllocationGranularityMinimum)
		assert.ErrorIs(t, err, ErrorUnknown, "granularity %d", g)
	}
	setG.Call(2 << 20)
	g, err := d.AllocationGranularity(&MemAllocationProp{}, MemAllocationGranularityMinimum)
	require.NoError(t, err)
	assert.Equal(t, uint64(2<<20), g)

	setA, err := lib.Lookup("fake_set_attribute")
	require.NoError(t, err)
	setA.Call(uintptr(uint32(0xfffffffb))) // -5 as a C int
	f, err := d.Features()
	require.NoError(t, err)
	assert.Equal(t, -1, f.HostNUMAID, "a negative node is unknown")
	assert.True(t, f.MemoryPools, "non-zero flags read as true")
}

// FuzzDeviceCount feeds enumerate every count a driver could report: it
// never panics, and refuses exactly the impossible ones. (The zero Driver
// resolves no cuDeviceGet, so a plausible non-zero count ends in
// ErrNotSupported at device 0.)
func FuzzDeviceCount(f *testing.F) {
	for _, n := range []int32{0, 1, 2, -1, -1 << 31, 1<<31 - 1, maxDevices, maxDevices + 1} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int32) {
		saved := deviceCount
		deviceCount = func(*driver) (int32, uintptr) { return n, 0 }
		defer func() { deviceCount = saved }()
		devs, err := enumerate(&driver{})
		switch {
		case n < 0 || n > maxDevices:
			if !errors.Is(err, ErrorUnknown) || devs != nil {
				t.Fatalf("count %d: got %d devices, error %v; want an error matching ErrorUnknown", n, len(devs), err)
			}
		case n == 0:
			if err != nil || len(devs) != 0 {
				t.Fatalf("count 0: got %d devices, error %v", len(devs), err)
			}
		default:
			if !errors.Is(err, ErrNotSupported) {
				t.Fatalf("count %d: error %v, want ErrNotSupported from the missing cuDeviceGet", n, err)
			}
		}
	})
}
