package resource_test

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// attributer is a pool resource (DevicePool, PinnedPool).
type attributer interface {
	Attributes() (resource.PoolAttributes, error)
}

// syncAll waits for all work on the devices.
func syncAll(t testing.TB, devs ...*cuda.Device) {
	t.Helper()
	for _, d := range devs {
		require.NoError(t, d.Sync())
	}
}

// checkLeaks records the pool's UsedMemCurrent and buffer.Leaks() now and
// asserts, when the test's cleanups reach it, that both are back. Register
// it after the pool's Close cleanup so it runs before the pool closes.
func checkLeaks(t *testing.T, pool attributer, devs ...*cuda.Device) {
	t.Helper()
	syncAll(t, devs...)
	a, err := pool.Attributes()
	require.NoError(t, err)
	used, leaks := a.UsedMemCurrent, buffer.Leaks()
	t.Cleanup(func() {
		syncAll(t, devs...)
		a, err := pool.Attributes()
		if assert.NoError(t, err) {
			assert.Equal(t, used, a.UsedMemCurrent, "pool memory in use at the end of the test")
		}
		assert.Equal(t, leaks, buffer.Leaks(), "buffers collected without Close")
	})
}

// checkBufferLeaks asserts buffer.Leaks() is unchanged at the end.
func checkBufferLeaks(t *testing.T) {
	leaks := buffer.Leaks()
	t.Cleanup(func() { assert.Equal(t, leaks, buffer.Leaks(), "buffers collected without Close") })
}

// ownedPool creates an owned DevicePool closed at the end of the test,
// skipping when the feature asked for is missing.
func ownedPool(t *testing.T, dev *cuda.Device, opts *resource.DevicePoolOptions) *resource.DevicePool {
	t.Helper()
	p, err := resource.NewDevicePool(dev, opts)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// readBack copies n bytes at p to the host through s.
func readBack(t testing.TB, s *cuda.Stream, p cuda.DevicePtr, n uint64) []byte {
	t.Helper()
	out := make([]byte, n)
	require.NoError(t, s.MemcpyDtoHAsync(unsafe.Pointer(&out[0]), p, n))
	require.NoError(t, s.Sync())
	return out
}

// upload copies data to p through s.
func upload(t testing.TB, s *cuda.Stream, p cuda.DevicePtr, data []byte) {
	t.Helper()
	require.NoError(t, s.MemcpyHtoDAsync(p, unsafe.Pointer(&data[0]), uint64(len(data))))
	require.NoError(t, s.Sync())
}

// hostView is the CPU's view of host-accessible buffer memory (pinned or
// managed), whose unified address is its host address.
func hostView(b *buffer.Buffer) []byte {
	u := uintptr(b.Ptr())
	p := *(*unsafe.Pointer)(unsafe.Pointer(&u))
	return unsafe.Slice((*byte)(p), b.Size())
}

// deviceLoc is the location of device d.
func deviceLoc(d *cuda.Device) cuda.MemLocation {
	return cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())}
}

var hostLoc = cuda.MemLocation{Type: cuda.MemLocationTypeHost}

// closeBuf closes b, failing the test on error.
func closeBuf(t testing.TB, b *buffer.Buffer) {
	t.Helper()
	require.NoError(t, b.Close())
}
