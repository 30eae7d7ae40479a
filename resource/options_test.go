package resource

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

func TestDevicePoolOptionsCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts DevicePoolOptions
		goos string
		err  error
		msg  string
	}{
		{name: "zero", goos: "linux"},
		{name: "ipc on linux", opts: DevicePoolOptions{IPC: true}, goos: "linux"},
		{name: "ipc on windows", opts: DevicePoolOptions{IPC: true}, goos: "windows", err: cuda.ErrNotSupported,
			msg: "NewDevicePool: cuda: not supported: IPC-enabled pools use POSIX file descriptors, available on Linux only (not windows)"},
		{name: "reserve within max", opts: DevicePoolOptions{MaxSize: 4 << 20, InitialReserve: 4 << 20}, goos: "linux"},
		{name: "reserve over max", opts: DevicePoolOptions{MaxSize: 2 << 20, InitialReserve: 4 << 20}, goos: "linux", err: cuda.ErrInvalidArgument,
			msg: "NewDevicePool: cuda: invalid argument: InitialReserve 4194304 exceeds MaxSize 2097152"},
		{name: "reserve with default threshold", opts: DevicePoolOptions{InitialReserve: 1 << 31}, goos: "linux"},
		{name: "reserve over threshold", opts: DevicePoolOptions{ReleaseThreshold: 1 << 20, InitialReserve: 4 << 20}, goos: "linux", err: cuda.ErrInvalidArgument,
			msg: "NewDevicePool: cuda: invalid argument: InitialReserve 4194304 exceeds ReleaseThreshold 1048576: the pool would release the reserve at the next synchronization"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.check(tc.goos)
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			assert.Equal(t, tc.msg, err.Error())
		})
	}
}

func TestPinnedPoolOptionsCheck(t *testing.T) {
	node, bad := 1, -1
	assert.NoError(t, (&PinnedPoolOptions{}).check("linux"))
	assert.NoError(t, (&PinnedPoolOptions{NUMANode: &node, IPC: true}).check("linux"))
	err := (&PinnedPoolOptions{NUMANode: &bad}).check("linux")
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	err = (&PinnedPoolOptions{IPC: true}).check("darwin")
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "Linux only (not darwin)")
}

func TestCheckLocation(t *testing.T) {
	for _, loc := range []cuda.MemLocation{
		{Type: cuda.MemLocationTypeHost},
		{Type: cuda.MemLocationTypeHostNUMA, ID: 0},
		{Type: cuda.MemLocationTypeHostNUMA, ID: 3},
		{Type: cuda.MemLocationTypeHostNUMACurrent},
	} {
		assert.NoError(t, checkLocation("op", "loc", loc), "%+v", loc)
	}
	for _, tc := range []struct {
		loc cuda.MemLocation
		msg string
	}{
		{cuda.MemLocation{}, "op: cuda: invalid argument: loc: a location is required (cuda.DeviceLocation, cuda.HostLocation, cuda.HostNUMALocation or cuda.HostNUMACurrentLocation)"},
		{cuda.MemLocation{Type: 9, ID: 2}, "op: cuda: invalid argument: loc: location type 9 (id 2) is not a device, host or host NUMA location"},
		{cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: -4}, "op: cuda: invalid argument: loc: negative NUMA node -4"},
	} {
		err := checkLocation("op", "loc", tc.loc)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Equal(t, tc.msg, err.Error())
	}
}

func TestThreshold(t *testing.T) {
	assert.Equal(t, uint64(keepAll), threshold(0))
	assert.Equal(t, uint64(5), threshold(5))
}

func TestHostPtrRoundTrip(t *testing.T) {
	x := new(int)
	p := devicePtr(unsafePointer(x))
	assert.Equal(t, unsafePointer(x), hostPtr(p))
}

func unsafePointer(x *int) unsafe.Pointer { return unsafe.Pointer(x) }
