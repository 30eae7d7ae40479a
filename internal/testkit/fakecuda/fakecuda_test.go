package fakecuda_test

import (
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var fake *fakecuda.Driver

func TestMain(m *testing.M) { fakecuda.Main(m, "fakecuda", &fake) }

func TestFakeDevices(t *testing.T) {
	n, err := cuda.DeviceCount()
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	d, err := cuda.GetDevice(0)
	require.NoError(t, err)
	f, err := d.Features()
	require.NoError(t, err)
	assert.True(t, f.MemoryPools && f.VirtualMemory && f.PosixFDHandles && f.PoolIPC && f.ManagedMemory)
	missing, err := cuda.DriverMissing()
	require.NoError(t, err)
	t.Logf("entry points the fake lacks: %v", missing)
	assert.NotContains(t, missing, "cuMemAlloc")
	assert.NotContains(t, missing, "cuMemMap")
}

func TestFakeAllocCopyCounts(t *testing.T) {
	d, err := cuda.GetDevice(0)
	require.NoError(t, err)
	_, err = d.Context() // retained once per process: not part of the baseline
	require.NoError(t, err)
	base := fake.Snapshot()
	p, err := d.MemAlloc(1000)
	require.NoError(t, err)
	assert.Equal(t, base[fakecuda.DeviceBytes]+1000, fake.Stat(fakecuda.DeviceBytes))
	src := []byte("hello, fake device")
	require.NoError(t, d.MemcpyHtoD(p, unsafe.Pointer(&src[0]), uint64(len(src))))
	dst := make([]byte, len(src))
	require.NoError(t, d.MemcpyDtoH(unsafe.Pointer(&dst[0]), p, uint64(len(dst))))
	assert.Equal(t, src, dst)
	// Out of bounds and unknown device addresses are errors, not crashes.
	err = d.MemcpyDtoH(unsafe.Pointer(&dst[0]), p+990, uint64(len(dst)))
	assert.ErrorIs(t, err, cuda.ErrorInvalidValue)
	err = d.MemcpyDtoH(unsafe.Pointer(&dst[0]), 0x1000, 4)
	assert.ErrorIs(t, err, cuda.ErrorInvalidValue)
	_, err = d.MemAlloc(1 << 62)
	assert.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	require.NoError(t, d.MemFree(p))
	assert.ErrorIs(t, d.MemFree(p), cuda.ErrorInvalidValue, "double free is caught")
	assert.Empty(t, fake.Snapshot().Diff(base))
}

func TestFakePoolAndVMM(t *testing.T) {
	d, err := cuda.GetDevice(1)
	require.NoError(t, err)
	_, err = d.Context() // retained once per process: not part of the baseline
	require.NoError(t, err)
	base := fake.Snapshot()
	pool, err := d.CreateMemPool(&cuda.MemPoolProps{AllocType: cuda.MemAllocationTypePinned,
		HandleTypes: cuda.MemHandleTypePosixFileDescriptor, Location: cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 1}})
	require.NoError(t, err)
	s, err := d.NewStream()
	require.NoError(t, err)
	p, err := s.MemAllocFromPoolAsync(pool, 4096)
	require.NoError(t, err)
	used, err := pool.Attribute(cuda.MemPoolAttrUsedMemCurrent)
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), used)
	assert.Equal(t, base[fakecuda.DeviceBytes1]+4096, fake.Stat(fakecuda.DeviceBytes1))
	require.NoError(t, s.MemFreeAsync(p))
	require.NoError(t, pool.Destroy())
	require.NoError(t, s.Close())

	prop := cuda.MemAllocationProp{Type: cuda.MemAllocationTypePinned, RequestedHandleTypes: cuda.MemHandleTypePosixFileDescriptor,
		Location: cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 1}}
	g, err := d.AllocationGranularity(&prop, 0)
	require.NoError(t, err)
	h, err := d.MemCreate(g, &prop)
	require.NoError(t, err)
	va, err := d.MemAddressReserve(2*g, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MemMap(va, g, 0, h))
	require.NoError(t, d.MemRelease(h), "the mapping keeps the memory")
	buf := make([]byte, 16)
	src := unsafe.Pointer(&buf[0])
	assert.ErrorIs(t, d.MemcpyHtoD(va, src, 16), cuda.ErrorIllegalAddress, "no access set yet")
	require.NoError(t, d.MemSetAccess(va, g, cuda.MemAccessDesc{Location: cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 1}, Flags: cuda.MemAccessProtReadWrite}))
	require.NoError(t, d.MemcpyHtoD(va+cuda.DevicePtr(g)-16, src, 16))
	assert.ErrorIs(t, d.MemcpyHtoD(va+cuda.DevicePtr(g)-8, src, 16), cuda.ErrorIllegalAddress, "past the mapping")
	require.NoError(t, d.MemUnmap(va, g))
	require.NoError(t, d.MemAddressFree(va, 2*g))
	assert.Empty(t, fake.Snapshot().Diff(base))
}
