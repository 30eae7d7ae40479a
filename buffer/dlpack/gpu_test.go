//go:build linux

package dlpack_test

// GPU tests (names start with TestGPU): they skip without a driver and a
// device (cudatest.Device), and fail instead with CUDAMEM_REQUIRE_GPU=1.

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

const mib = 1 << 20

// ownedPool is a pool of the test's own, so that its usage counts only
// the test's memory.
func ownedPool(t *testing.T, d *cuda.Device) *resource.DevicePool {
	t.Helper()
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 64 * mib})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	return pool
}

// used is the pool's UsedMemCurrent once the device's work (frees
// included) is done.
func used(t *testing.T, pool *resource.DevicePool, d *cuda.Device) uint64 {
	t.Helper()
	require.NoError(t, d.Sync())
	a, err := pool.Attributes()
	require.NoError(t, err)
	return a.UsedMemCurrent
}

// TestGPUExportImportDevice exports a device buffer, imports the tensor
// back as a C library handed it on would, writes through the imported
// Buffer with a kernel and a copy, reads the data back through the
// original, and checks that the memory goes back to the pool once, after
// both the original's Close and the import's Close (the deleter).
func TestGPUExportImportDevice(t *testing.T) {
	d := cudatest.Device(t)
	pool := ownedPool(t, d)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	start := used(t, pool, d)
	strays := dlpack.StrayDeletes()

	const n = 4 * mib
	b, err := pool.Allocate(n, s)
	require.NoError(t, err)
	v, err := dlpack.Export(b)
	require.NoError(t, err)
	want := dlpack.Device{Type: dlpack.CUDA, ID: int32(d.Ordinal())}
	assert.Equal(t, want, v.Tensor.Device)
	assert.Equal(t, uintptr(b.Ptr()), v.Tensor.Data)

	in, err := dlpack.Import(addr(v), dlpack.ExpectDevice(want))
	require.NoError(t, err)
	assert.Equal(t, b.Ptr(), in.Ptr())
	assert.Equal(t, uint64(n), in.Size())
	assert.True(t, in.DeviceAccessible())
	assert.False(t, in.HostAccessible())
	assert.Equal(t, d.Ordinal(), in.DeviceID())

	// A kernel writes through the import; the original reads it.
	require.NoError(t, k.Write(s, in.Ptr(), n, 5))
	out := make([]byte, n)
	require.NoError(t, buffer.CopyToHost(out, b, s))
	assert.True(t, bytes.Equal(cudatest.Pattern(n, 5), out), "the kernel's pattern, read through the original")

	// A copy from the import into another buffer, checked on the device.
	c, err := pool.Allocate(n, s)
	require.NoError(t, err)
	require.NoError(t, in.CopyTo(c, s))
	k.RequireCheck(t, s, c.Ptr(), n, 5)
	require.NoError(t, c.Close())

	require.NoError(t, b.Close(), "the original closes first")
	assert.GreaterOrEqual(t, used(t, pool, d)-start, uint64(n), "still allocated under the import")
	assert.Equal(t, 1, dlpack.Live())
	require.NoError(t, in.CloseOn(s), "waits for s, then runs the deleter")
	assert.Zero(t, dlpack.Live(), "the deleter ran")
	assert.Equal(t, start, used(t, pool, d), "the deleter gave the memory back")
	require.NoError(t, in.Close())
	assert.Equal(t, strays, dlpack.StrayDeletes(), "the deleter ran once, with nothing stray")
	assert.Zero(t, dlpack.FailedFrees())
}

// TestGPUExportDeleterFromCThread closes a device buffer, then lets a C
// thread the Go runtime never saw call the deleter: the free through the
// driver runs, and the pool's usage comes back.
func TestGPUExportDeleterFromCThread(t *testing.T) {
	l := needC(t)
	d := cudatest.Device(t)
	pool := ownedPool(t, d)
	s := cudatest.Stream(t, d)
	start := used(t, pool, d)
	for _, versioned := range []bool{true, false} {
		b, err := pool.Allocate(2*mib, s)
		require.NoError(t, err)
		require.NoError(t, b.Fill8(1, s))
		var p uintptr
		if versioned {
			v, err := dlpack.Export(b)
			require.NoError(t, err)
			p = addr(v)
		} else {
			u, err := dlpack.ExportUnversioned(b)
			require.NoError(t, err)
			p = addr(u)
		}
		require.NoError(t, s.Sync())
		require.NoError(t, b.Close())
		require.NoError(t, l.DeleteOnThread(p, versioned))
		assert.Equal(t, start, used(t, pool, d), "versioned %v", versioned)
	}
	assert.Zero(t, dlpack.Live())
}

// TestGPUDeviceTypes is cuda.core's test_buffer_dunder_dlpack_device_success
// on real resources, each exported and imported back.
func TestGPUDeviceTypes(t *testing.T) {
	d := cudatest.Device(t)
	f, err := d.Features()
	require.NoError(t, err)
	pool, err := resource.CurrentDevicePool(d)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	sync, err := resource.NewSyncDevice(d)
	require.NoError(t, err)
	pinned, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	cases := []struct {
		name string
		mr   buffer.MemoryResource
		want dlpack.Device
	}{
		{"device pool", pool, dlpack.Device{Type: dlpack.CUDA, ID: int32(d.Ordinal())}},
		{"device sync", sync, dlpack.Device{Type: dlpack.CUDA, ID: int32(d.Ordinal())}},
		{"pinned", pinned, dlpack.Device{Type: dlpack.CUDAHost}},
	}
	if f.ManagedMemory {
		managed, err := resource.NewManaged(d, nil)
		require.NoError(t, err)
		cases = append(cases, struct {
			name string
			mr   buffer.MemoryResource
			want dlpack.Device
		}{"managed", managed, dlpack.Device{Type: dlpack.CUDAHost}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := buffer.Allocate(c.mr, mib, nil)
			require.NoError(t, err)
			got, err := dlpack.DeviceOf(b)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			v, err := dlpack.Export(b)
			require.NoError(t, err)
			in, err := dlpack.Import(addr(v), dlpack.ExpectDevice(c.want))
			require.NoError(t, err, "the driver vouches for the export")
			require.NoError(t, in.Fill8(3, nil))
			out := make([]byte, mib)
			require.NoError(t, buffer.CopyToHost(out, b, nil))
			assert.Equal(t, byte(3), out[0])
			assert.Equal(t, byte(3), out[mib-1])
			require.NoError(t, d.Sync())
			require.NoError(t, in.Close())
			require.NoError(t, b.Close())
			assert.Zero(t, dlpack.Live())
		})
	}
}

// TestGPUImportHostLabels imports real driver memory under each label a
// producer may give it. Host memory the driver made (legacy pinned,
// pinned pools, managed) passes the host checks as kDLCPU, and the Buffer
// reads and writes it; device-only memory is refused as kDLCPU (the
// driver named in the error), kDLCUDAHost and kDLCUDAManaged, since a
// host-accessible Buffer over it would crash the first host read.
func TestGPUImportHostLabels(t *testing.T) {
	d := cudatest.Device(t)
	f, err := d.Features()
	require.NoError(t, err)
	sd, err := resource.NewSyncDevice(d)
	require.NoError(t, err)
	dev, err := sd.Allocate(mib, nil)
	require.NoError(t, err)
	defer dev.Close()
	label := func(data uintptr, n int, typ dlpack.DeviceType) *hostile {
		h := newHostile()
		h.m.Tensor.Data, h.shape[0], h.m.Tensor.Device = data, int64(n), dlpack.Device{Type: typ}
		return h
	}
	for _, typ := range []dlpack.DeviceType{dlpack.CPU, dlpack.CUDAHost, dlpack.CUDAManaged} {
		h := label(uintptr(dev.Ptr()), mib, typ)
		_, err := dlpack.Import(addr(&h.m))
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "device memory as %v", typ)
		if typ == dlpack.CPU {
			assert.ErrorContains(t, err, "device memory", "the driver's word is in the error")
		} else {
			assert.ErrorContains(t, err, "not reachable from the host")
		}
	}

	host := map[string]buffer.MemoryResource{}
	if pinned, err := resource.NewLegacyPinned(); assert.NoError(t, err) {
		host["legacy pinned"] = pinned
	}
	if pool, err := resource.NewPinnedPool(nil); err == nil {
		t.Cleanup(func() { assert.NoError(t, pool.Close()) })
		host["pinned pool"] = pool
	} else {
		cudatest.SkipIfNotSupported(t, err)
		t.Logf("no pinned pool: %v", err)
	}
	if f.ManagedMemory {
		managed, err := resource.NewManaged(d, nil)
		require.NoError(t, err)
		host["managed"] = managed
	}
	for name, mr := range host {
		t.Run(name, func(t *testing.T) {
			b, err := buffer.Allocate(mr, mib, nil)
			require.NoError(t, err)
			defer b.Close()
			require.NoError(t, d.Sync())
			for _, typ := range []dlpack.DeviceType{dlpack.CPU, dlpack.CUDAHost, dlpack.CUDAManaged} {
				h := label(uintptr(b.Ptr()), mib, typ)
				in, err := dlpack.Import(addr(&h.m))
				require.NoError(t, err, "%s memory as %v", name, typ)
				assert.True(t, in.HostAccessible())
				_, err = in.WriteAt(bytes.Repeat([]byte{byte(typ)}, mib), 0)
				require.NoError(t, err)
				got := make([]byte, mib)
				_, err = in.ReadAt(got, 0)
				require.NoError(t, err)
				assert.Equal(t, byte(typ), got[mib-1])
				require.NoError(t, in.Close())
			}
		})
	}
}
