//go:build linux

package dlpack_test

import (
	"runtime"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/dlpacktest"
)

// TestImportRoundTrip exports a buffer and imports the tensor back, as a
// C library handed it on would: the same bytes, both ways, and the
// deleter runs once, at the imported Buffer's Close.
func TestImportRoundTrip(t *testing.T) {
	needSupported(t)
	for _, versioned := range []bool{true, false} {
		h := newHeap()
		b := h.alloc(t, 256)
		orig, err := b.Bytes()
		require.NoError(t, err)
		for i := range orig {
			orig[i] = byte(i)
		}
		var p uintptr
		var in *buffer.Buffer
		if versioned {
			v, err := dlpack.Export(b)
			require.NoError(t, err)
			p = addr(v)
			in, err = dlpack.Import(p, dlpack.ExpectDevice(dlpack.Device{Type: dlpack.CPU}))
			require.NoError(t, err)
		} else {
			u, err := dlpack.ExportUnversioned(b)
			require.NoError(t, err)
			p = addr(u)
			in, err = dlpack.ImportUnversioned(p)
			require.NoError(t, err)
		}
		assert.Equal(t, b.Ptr(), in.Ptr())
		assert.Equal(t, uint64(256), in.Size())
		assert.True(t, in.HostAccessible())
		assert.False(t, in.DeviceAccessible())
		assert.Equal(t, -1, in.DeviceID())
		got, err := in.Bytes()
		require.NoError(t, err)
		assert.Equal(t, orig, got, "the same bytes")
		got[7] = 0xee
		assert.Equal(t, byte(0xee), orig[7], "writes through the import reach the original")
		d, err := dlpack.DeviceOf(in)
		require.NoError(t, err)
		assert.Equal(t, dlpack.Device{Type: dlpack.CPU}, d)
		_, err = buffer.Allocate(in.Resource(), 8, nil)
		assert.ErrorIs(t, err, cuda.ErrNotSupported, "an import's resource cannot allocate")

		require.NoError(t, b.Close(), "the original closes first: the import still holds it")
		assert.Zero(t, h.freed())
		assert.Equal(t, 1, dlpack.Live())
		require.NoError(t, in.Close())
		assert.Zero(t, dlpack.Live(), "Close ran the deleter")
		assert.Equal(t, 1, h.freed(), "and the deleter freed the memory")
		require.NoError(t, in.Close())
		assert.Equal(t, 1, h.freed())
	}
}

// TestImportCTensor imports tensors a C producer made, and checks that
// the producer's deleter runs exactly once, at Close.
func TestImportCTensor(t *testing.T) {
	l := needC(t)
	data := l.Alloc(4096)
	defer l.Free(data)
	for _, versioned := range []bool{true, false} {
		spec := dlpacktest.Spec{DevType: 1, Code: 2, Bits: 32, Lanes: 1, Major: 1, ByteOffset: 64, Shape: []int64{4, 8}}
		p := l.Make(versioned, data, spec)
		before := l.Deleted()
		var b *buffer.Buffer
		var err error
		if versioned {
			b, err = dlpack.Import(p)
		} else {
			b, err = dlpack.ImportUnversioned(p)
		}
		require.NoError(t, err)
		assert.Equal(t, cuda.DevicePtr(data+64), b.Ptr(), "data + byte_offset")
		assert.Equal(t, uint64(4*8*4), b.Size(), "4x8 float32")
		bs, err := b.Bytes()
		require.NoError(t, err)
		bs[0] = 42
		assert.Equal(t, before, l.Deleted(), "not deleted while in use")
		require.NoError(t, b.Close())
		assert.Equal(t, before+1, l.Deleted(), "Close calls the deleter")
		require.NoError(t, b.Close())
		assert.Equal(t, before+1, l.Deleted(), "exactly once")
	}
}

// TestImportExtent covers the shapes, strides and types Import sizes.
func TestImportExtent(t *testing.T) {
	l := needC(t)
	data := l.Alloc(1 << 16)
	defer l.Free(data)
	for _, c := range []struct {
		name string
		spec dlpacktest.Spec
		size uint64
	}{
		{"row-major", dlpacktest.Spec{Code: 2, Bits: 32, Lanes: 1, Shape: []int64{2, 3}}, 24},
		{"row-major strides", dlpacktest.Spec{Code: 2, Bits: 32, Lanes: 1, Shape: []int64{2, 3}, Strides: []int64{3, 1}}, 24},
		{"column-major", dlpacktest.Spec{Code: 2, Bits: 64, Lanes: 1, Shape: []int64{2, 3}, Strides: []int64{1, 2}}, 48},
		{"3-D permuted", dlpacktest.Spec{Code: 0, Bits: 16, Lanes: 1, Shape: []int64{2, 3, 4}, Strides: []int64{4, 8, 1}}, 48},
		{"size-1 dims any stride", dlpacktest.Spec{Code: 1, Bits: 8, Lanes: 1, Shape: []int64{1, 5, 1}, Strides: []int64{999, 1, -7}}, 5},
		{"scalar", dlpacktest.Spec{Code: 5, Bits: 64, Lanes: 1}, 8},
		{"vector lanes", dlpacktest.Spec{Code: 2, Bits: 32, Lanes: 4, Shape: []int64{3}}, 48},
		{"bool", dlpacktest.Spec{Code: 6, Bits: 8, Lanes: 1, Shape: []int64{7}}, 7},
		{"fp4 packed", dlpacktest.Spec{Code: 17, Bits: 4, Lanes: 1, Shape: []int64{5}}, 3},
		{"fp4 padded", dlpacktest.Spec{Code: 17, Bits: 4, Lanes: 1, Shape: []int64{5}, Flags: dlpack.FlagIsSubbytePadded}, 5},
		{"fp6 packed", dlpacktest.Spec{Code: 15, Bits: 6, Lanes: 1, Shape: []int64{3}}, 3},
		{"empty", dlpacktest.Spec{Code: 2, Bits: 32, Lanes: 1, Shape: []int64{4, 0}, Strides: []int64{5, 77}}, 0},
		{"offset", dlpacktest.Spec{Code: 1, Bits: 8, Lanes: 1, Shape: []int64{10}, ByteOffset: 1000}, 10},
		{"copied flag", dlpacktest.Spec{Code: 1, Bits: 8, Lanes: 1, Shape: []int64{10}, Flags: dlpack.FlagIsCopied}, 10},
		{"newer minor, unknown type code", dlpacktest.Spec{Code: 200, Bits: 16, Lanes: 1, Shape: []int64{10}}, 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.spec.DevType, c.spec.Major = 1, 1
			p := l.Make(true, data, c.spec)
			b, err := dlpack.Import(p)
			require.NoError(t, err)
			assert.Equal(t, c.size, b.Size())
			assert.Equal(t, cuda.DevicePtr(data)+cuda.DevicePtr(c.spec.ByteOffset), b.Ptr())
			before := l.Deleted()
			require.NoError(t, b.Close())
			assert.Equal(t, before+1, l.Deleted())
		})
	}

	// Read-only tensors need AllowReadOnly.
	p := l.Make(true, data, dlpacktest.Spec{DevType: 1, Code: 1, Bits: 8, Lanes: 1, Major: 1, Shape: []int64{8}, Flags: dlpack.FlagReadOnly})
	_, err := dlpack.Import(p)
	assert.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.ErrorContains(t, err, "read-only")
	b, err := dlpack.Import(p, dlpack.AllowReadOnly())
	require.NoError(t, err)
	require.NoError(t, b.Close())

	// A zero-byte tensor with no data: released at once, an empty Buffer.
	before := l.Deleted()
	p = l.Make(true, 0, dlpacktest.Spec{DevType: 1, Code: 1, Bits: 8, Lanes: 1, Major: 1, Shape: []int64{0}})
	b, err = dlpack.Import(p)
	require.NoError(t, err)
	assert.Zero(t, b.Size())
	assert.Equal(t, before+1, l.Deleted(), "nothing to hold: deleted at import")
	require.NoError(t, b.Close())
	assert.Equal(t, before+1, l.Deleted())
}

// TestImportFailureCleanup: a refused tensor is still the caller's; its
// deleter has not run, and Delete runs it.
func TestImportFailureCleanup(t *testing.T) {
	l := needC(t)
	data := l.Alloc(64)
	defer l.Free(data)
	for _, c := range []struct {
		name string
		spec dlpacktest.Spec
		opts []dlpack.ImportOption
		is   error
	}{
		{"major version 2", dlpacktest.Spec{DevType: 1, Major: 2, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}}, nil, cuda.ErrNotSupported},
		{"major version 0", dlpacktest.Spec{DevType: 1, Major: 0, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}}, nil, cuda.ErrNotSupported},
		{"unexpected device", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}},
			[]dlpack.ImportOption{dlpack.ExpectDevice(dlpack.Device{Type: dlpack.CUDA})}, cuda.ErrInvalidArgument},
		{"ROCm", dlpacktest.Spec{DevType: 10, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}}, nil, cuda.ErrNotSupported},
		{"undefined device type", dlpacktest.Spec{DevType: 99, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}}, nil, cuda.ErrInvalidArgument},
		{"negative device", dlpacktest.Spec{DevType: 2, DevID: -1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}}, nil, cuda.ErrInvalidArgument},
		{"gaps", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{2, 3}, Strides: []int64{4, 1}}, nil, cuda.ErrNotSupported},
		{"overlap", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{2, 3}, Strides: []int64{1, 1}}, nil, cuda.ErrNotSupported},
		{"negative stride", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{4}, Strides: []int64{-1}}, nil, cuda.ErrNotSupported},
		{"negative dim", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{3, -2}}, nil, cuda.ErrInvalidArgument},
		{"overflowing shape", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{1 << 40, 1 << 40}}, nil, cuda.ErrInvalidArgument},
		{"overflowing bytes", dlpacktest.Spec{DevType: 1, Major: 1, Code: 2, Bits: 64, Lanes: 1, Shape: []int64{1 << 62}}, nil, cuda.ErrInvalidArgument},
		{"zero bits", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 0, Lanes: 1, Shape: []int64{8}}, nil, cuda.ErrInvalidArgument},
		{"zero lanes", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 0, Shape: []int64{8}}, nil, cuda.ErrInvalidArgument},
		{"too many dims", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: make([]int64, dlpack.MaxDims+1)}, nil, cuda.ErrInvalidArgument},
		{"offset wraps", dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}, ByteOffset: ^uint64(0) - 2}, nil, cuda.ErrInvalidArgument},
		{"CUDA without a driver's word", dlpacktest.Spec{DevType: 2, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}}, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := l.Make(true, data, c.spec)
			before := l.Deleted()
			_, err := dlpack.Import(p, c.opts...)
			require.Error(t, err)
			if c.is != nil {
				assert.ErrorIs(t, err, c.is)
			}
			assert.ErrorContains(t, err, "dlpack.Import")
			assert.Equal(t, before, l.Deleted(), "a refused tensor is still the caller's")
			require.NoError(t, dlpack.Delete(p))
			assert.Equal(t, before+1, l.Deleted(), "Delete calls its deleter")
		})
	}
	// Null data with bytes to cover.
	p := l.Make(false, 0, dlpacktest.Spec{DevType: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{8}})
	_, err := dlpack.ImportUnversioned(p)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorContains(t, err, "null data")
	before := l.Deleted()
	require.NoError(t, dlpack.DeleteUnversioned(p))
	assert.Equal(t, before+1, l.Deleted())
}

// hostile builds a versioned tensor in Go memory with the fields set
// wants; no deleter, so nothing can call garbage.
type hostile struct {
	m     dlpack.ManagedTensorVersioned
	shape [4]int64
	bytes [64]byte
}

// hostiles keeps every hostile on the heap: Import reads one through its
// address alone, which a copied goroutine stack would leave behind.
var hostiles struct {
	sync.Mutex
	all []*hostile
}

func newHostile() *hostile {
	h := &hostile{}
	hostiles.Lock()
	hostiles.all = append(hostiles.all, h)
	hostiles.Unlock()
	h.shape[0] = 16
	h.m.Version = dlpack.Version{Major: 1, Minor: 1}
	h.m.Tensor = dlpack.Tensor{Data: uintptr(unsafe.Pointer(&h.bytes[0])), Device: dlpack.Device{Type: dlpack.CPU},
		NDim: 1, DType: dlpack.Byte, Shape: uintptr(unsafe.Pointer(&h.shape[0]))}
	return h
}

// TestImportHostile feeds Import tensors with garbage fields, pointers
// into unmapped memory included: each is an error, never a crash.
func TestImportHostile(t *testing.T) {
	needSupported(t)
	gone := unmapped(t)
	ok := newHostile()
	b, err := dlpack.Import(addr(&ok.m))
	require.NoError(t, err, "the baseline is accepted")
	assert.Equal(t, uint64(16), b.Size())
	require.NoError(t, b.Close())

	for _, c := range []struct {
		name string
		set  func(h *hostile)
		is   error
	}{
		{"unmapped shape", func(h *hostile) { h.m.Tensor.Shape = gone }, cuda.ErrInvalidArgument},
		{"null shape", func(h *hostile) { h.m.Tensor.Shape = 0 }, cuda.ErrInvalidArgument},
		{"odd shape", func(h *hostile) { h.m.Tensor.Shape++ }, cuda.ErrInvalidArgument},
		{"unmapped strides", func(h *hostile) { h.m.Tensor.Strides = gone }, cuda.ErrInvalidArgument},
		{"unmapped data", func(h *hostile) { h.m.Tensor.Data = gone }, cuda.ErrInvalidArgument},
		{"data runs off a mapping", func(h *hostile) { h.m.Tensor.Data = gone - 8 }, cuda.ErrInvalidArgument},
		{"unmapped deleter", func(h *hostile) { h.m.Deleter = gone }, cuda.ErrInvalidArgument},
		{"negative ndim", func(h *hostile) { h.m.Tensor.NDim = -1 }, cuda.ErrInvalidArgument},
		{"huge ndim", func(h *hostile) { h.m.Tensor.NDim = 1 << 30 }, cuda.ErrInvalidArgument},
		{"major 0xffffffff", func(h *hostile) { h.m.Version.Major = ^uint32(0) }, cuda.ErrNotSupported},
		{"wrapping data", func(h *hostile) { h.m.Tensor.Data = ^uintptr(7) }, cuda.ErrInvalidArgument},
		{"device type -5", func(h *hostile) { h.m.Tensor.Device.Type = -5 }, cuda.ErrInvalidArgument},
		{"shape of min int64", func(h *hostile) { h.shape[0] = -1 << 63 }, cuda.ErrInvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHostile()
			c.set(h)
			_, err := dlpack.Import(addr(&h.m))
			assert.ErrorIs(t, err, c.is)
			runtime.KeepAlive(h)
		})
	}

	for _, p := range []uintptr{0, 1, 3, gone, ^uintptr(7)} {
		_, err := dlpack.Import(p)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "tensor at %#x", p)
		_, err = dlpack.ImportUnversioned(p)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "tensor at %#x", p)
		assert.ErrorIs(t, dlpack.Delete(p), cuda.ErrInvalidArgument)
		assert.ErrorIs(t, dlpack.DeleteUnversioned(p), cuda.ErrInvalidArgument)
	}
	h := newHostile()
	h.m.Deleter = gone
	assert.ErrorIs(t, dlpack.Delete(addr(&h.m)), cuda.ErrInvalidArgument, "an unmapped deleter is not called")
	h.m.Deleter = 0
	assert.NoError(t, dlpack.Delete(addr(&h.m)), "no deleter: nothing to do")
	runtime.KeepAlive(h)
}

// TestImportLostBuffer: an imported Buffer dropped without Close is
// released by the garbage-collection safety net, which calls the deleter.
func TestImportLostBuffer(t *testing.T) {
	l := needC(t)
	data := l.Alloc(64)
	defer l.Free(data)
	before, leaks := l.Deleted(), buffer.Leaks()
	require.NoError(t, dropImport(l, data))
	collectUntil(t, "the lost import's deleter ran", func() bool { return l.Deleted() == before+1 })
	assert.Equal(t, leaks+1, buffer.Leaks())
}

// unmapped returns an address with nothing mapped there.
func unmapped(t *testing.T) uintptr {
	b, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	p := uintptr(unsafe.Pointer(&b[0]))
	require.NoError(t, syscall.Munmap(b))
	return p
}

// dropImport imports a tensor and loses the Buffer.
//
//go:noinline
func dropImport(l *dlpacktest.Lib, data uintptr) error {
	_, err := dlpack.Import(l.Make(true, data, dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{64}}))
	return err
}
