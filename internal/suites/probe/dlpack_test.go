//go:build linux && (amd64 || arm64)

package probe

import (
	"errors"
	"os"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/internal/testkit/dlpacktest"
	"github.com/cudamem/cudamem/resource"
)

// DLPack on the fake driver: device, pinned and managed memory exported
// to the C test library and imported back, with the fake's counters
// proving the memory is freed once, after both Close and the deleter.

var (
	dlpOnce sync.Once
	dlpLib  *dlpacktest.Lib
	dlpErr  error
)

func dlpackLib(t *testing.T) *dlpacktest.Lib {
	t.Helper()
	dlpOnce.Do(func() {
		dir, err := os.MkdirTemp("", "probe-dlpack")
		if err != nil {
			dlpErr = err
			return
		}
		dlpDir = dir // removed by TestMain once every test is done with the library
		dlpLib, dlpErr = dlpacktest.Build(dir)
	})
	if errors.Is(dlpErr, dlpacktest.ErrNoCompiler) && !dlpacktest.Required() {
		t.Skip(dlpErr)
	}
	require.NoError(t, dlpErr)
	return dlpLib
}

func tensorAddr[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

func TestDLPackFakeDeviceTypes(t *testing.T) {
	l := dlpackLib(t)
	defer baseline(t)()
	d0, d1 := dev(t, 0), dev(t, 1)
	pool, err := resource.CurrentDevicePool(d0)
	require.NoError(t, err)
	sync1, err := resource.NewSyncDevice(d1)
	require.NoError(t, err)
	pinned, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	managed, err := resource.NewManaged(d0, nil)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		mr   buffer.MemoryResource
		want dlpack.Device
	}{
		{"device pool", pool, dlpack.Device{Type: dlpack.CUDA, ID: 0}},
		{"device 1", sync1, dlpack.Device{Type: dlpack.CUDA, ID: 1}},
		{"pinned", pinned, dlpack.Device{Type: dlpack.CUDAHost}},
		{"managed", managed, dlpack.Device{Type: dlpack.CUDAHost}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := buffer.Allocate(c.mr, 4096, nil)
			require.NoError(t, err)
			got, err := dlpack.DeviceOf(b)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			v, err := dlpack.Export(b)
			require.NoError(t, err)
			f := l.Describe(tensorAddr(v), true)
			assert.Equal(t, int64(c.want.Type), f.DevType)
			assert.Equal(t, int64(c.want.ID), f.DevID)
			in, err := dlpack.Import(tensorAddr(v), dlpack.ExpectDevice(c.want))
			require.NoError(t, err, "an export imports back")
			assert.Equal(t, b.Ptr(), in.Ptr())
			assert.Equal(t, b.DeviceAccessible(), in.DeviceAccessible())
			require.NoError(t, b.Close())
			require.NoError(t, in.Close())
			assert.Zero(t, dlpack.Live())
		})
	}
}

// TestDLPackFakeDeviceRoundTrip: a C library writes a device buffer
// through the exported tensor, the buffer reads it back, and the memory
// is freed after Close and the deleter, in both orders and from a C
// thread.
func TestDLPackFakeDeviceRoundTrip(t *testing.T) {
	l := dlpackLib(t)
	defer baseline(t)()
	d := dev(t, 0)
	pool, err := resource.CurrentDevicePool(d)
	require.NoError(t, err)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	const n = 1 << 16
	for _, closeFirst := range []bool{true, false} {
		used := fake.Stat(0)
		b, err := pool.Allocate(n, s)
		require.NoError(t, err)
		v, err := dlpack.Export(b)
		require.NoError(t, err)
		l.Fill(tensorAddr(v), true, 7) // the fake's device memory is host memory
		out := make([]byte, n)
		require.NoError(t, buffer.CopyToHost(out, b, s))
		for i, c := range out {
			if c != 7 {
				t.Fatalf("byte %d is %d after the C library wrote 7", i, c)
			}
		}
		in, err := dlpack.Import(tensorAddr(v), dlpack.ExpectDevice(dlpack.Device{Type: dlpack.CUDA, ID: 0}))
		require.NoError(t, err)
		require.NoError(t, in.Fill8(9, s), "a driver fill through the imported Buffer")
		require.NoError(t, buffer.CopyToHost(out, b, s))
		assert.Equal(t, byte(9), out[n-1])
		if closeFirst {
			require.NoError(t, b.Close())
			assert.Equal(t, used+n, fake.Stat(0), "still allocated for the consumer")
			require.NoError(t, in.CloseOn(s), "the deleter, after the stream")
		} else {
			require.NoError(t, in.Close())
			assert.Equal(t, used+n, fake.Stat(0), "the deleter frees nothing of an open buffer")
			require.NoError(t, b.Close())
		}
		assert.Equal(t, used, fake.Stat(0), "freed once both are done")
	}

	// The deleter from a thread the C library made, after Close.
	used := fake.Stat(0)
	b, err := pool.Allocate(n, s)
	require.NoError(t, err)
	u, err := dlpack.ExportUnversioned(b)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, l.DeleteOnThread(tensorAddr(u), false))
	assert.Equal(t, used, fake.Stat(0), "freed from the C thread's deleter")
	assert.Zero(t, dlpack.FailedFrees())
}

// TestDLPackFakeImportRefusals: CUDA tensors the driver does not vouch for.
func TestDLPackFakeImportRefusals(t *testing.T) {
	l := dlpackLib(t)
	defer baseline(t)()
	d := dev(t, 0)
	pool, err := resource.CurrentDevicePool(d)
	require.NoError(t, err)
	b, err := pool.Allocate(4096, nil)
	require.NoError(t, err)
	defer b.Close()
	host := l.Alloc(4096)
	defer l.Free(host)
	byteSpec := func(devType, id int32, n int64) dlpacktest.Spec {
		return dlpacktest.Spec{DevType: devType, DevID: id, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{n}}
	}
	for _, c := range []struct {
		name string
		data uintptr
		spec dlpacktest.Spec
	}{
		{"host memory called device memory", host, byteSpec(2, 0, 4096)},
		{"device 0 memory called device 1's", uintptr(b.Ptr()), byteSpec(2, 1, 4096)},
		{"no such device", uintptr(b.Ptr()), byteSpec(2, 7, 4096)},
		{"past the allocation", uintptr(b.Ptr()), byteSpec(2, 0, 1<<30)},
		{"host memory called pinned", host, byteSpec(3, 0, 16)},
		{"host memory called managed", host, byteSpec(13, 0, 16)},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := l.Make(true, c.data, c.spec)
			before := l.Deleted()
			_, err := dlpack.Import(p)
			wantErr(t, c.name, err, "dlpack.Import")
			assert.Equal(t, before, l.Deleted())
			require.NoError(t, dlpack.Delete(p))
			assert.Equal(t, before+1, l.Deleted())
		})
	}
	// The real thing is accepted: device, pinned and managed memory.
	managed, err := resource.NewManaged(d, nil)
	require.NoError(t, err)
	mb, err := managed.Allocate(64, nil)
	require.NoError(t, err)
	defer mb.Close()
	p := l.Make(true, uintptr(mb.Ptr()), byteSpec(13, 0, 64))
	in, err := dlpack.Import(p)
	require.NoError(t, err)
	assert.True(t, in.HostAccessible())
	assert.True(t, in.DeviceAccessible())
	assert.Equal(t, 0, in.DeviceID())
	require.NoError(t, in.Close())
	p = l.Make(false, uintptr(b.Ptr())+16, byteSpec(2, 0, 64))
	in, err = dlpack.ImportUnversioned(p)
	require.NoError(t, err)
	assert.Equal(t, b.Ptr()+16, in.Ptr())
	dv, err := in.Device()
	require.NoError(t, err)
	assert.Equal(t, 0, dv.Ordinal())
	require.NoError(t, in.Close())
}
