package dlpack_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
)

// TestBufferDunderDLPackDeviceSuccess is cuda.core's
// test_buffer_dunder_dlpack_device_success, with every accessibility.
func TestBufferDunderDLPackDeviceSuccess(t *testing.T) {
	for _, c := range []struct {
		name string
		mr   *access
		want dlpack.Device
	}{
		{"device", &access{dev: true, id: 0}, dlpack.Device{Type: dlpack.CUDA, ID: 0}},
		{"device 1", &access{dev: true, id: 1}, dlpack.Device{Type: dlpack.CUDA, ID: 1}},
		{"pinned", &access{dev: true, host: true, id: -1}, dlpack.Device{Type: dlpack.CUDAHost}},
		{"unified", &access{dev: true, host: true, id: 1}, dlpack.Device{Type: dlpack.CUDAHost}},
		{"host", &access{host: true, id: -1}, dlpack.Device{Type: dlpack.CPU}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := buffer.Allocate(c.mr, 1024, nil)
			require.NoError(t, err)
			defer b.Close()
			d, err := dlpack.DeviceOf(b)
			require.NoError(t, err)
			assert.Equal(t, c.want, d)
		})
	}
}

// TestBufferDunderDLPackDeviceFailure is cuda.core's
// test_buffer_dunder_dlpack_device_failure (the null resource), with the
// other buffers no device type fits.
func TestBufferDunderDLPackDeviceFailure(t *testing.T) {
	null := &access{id: -1}
	b, err := buffer.Allocate(null, 1024, nil)
	require.NoError(t, err)
	defer b.Close()
	_, err = dlpack.DeviceOf(b)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorContains(t, err, "buffer is neither device-accessible nor host-accessible")
	_, err = dlpack.Export(b)
	if isSupported() {
		assert.ErrorContains(t, err, "buffer is neither device-accessible nor host-accessible")
	} else {
		assert.ErrorIs(t, err, cuda.ErrNotSupported, "no DLPack on this system")
	}
	assert.Zero(t, b.Holds(), "a refused export holds nothing")

	nodev := &access{dev: true, id: -1}
	b2, err := buffer.Allocate(nodev, 16, nil)
	require.NoError(t, err)
	defer b2.Close()
	_, err = dlpack.DeviceOf(b2)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "device memory of no device")

	_, err = dlpack.DeviceOf(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = dlpack.DeviceOf(new(buffer.Buffer))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	closed := newHeap().alloc(t, 8)
	require.NoError(t, closed.Close())
	_, err = dlpack.DeviceOf(closed)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.ErrorContains(t, err, "dlpack.DeviceOf")
}

// TestBufferDunderDLPack is cuda.core's test_buffer_dunder_dlpack: both
// forms export, and what cannot be exported is refused. (cuda.core's
// refusals are of Python arguments: dl_device, copy, max_version; their
// Go counterparts are the forms' own and the option checks.)
func TestBufferDunderDLPack(t *testing.T) {
	needSupported(t)
	h := newHeap()
	b := h.alloc(t, 1024)
	defer b.Close()

	v, err := dlpack.Export(b)
	require.NoError(t, err)
	assert.Equal(t, dlpack.Version{Major: 1, Minor: 1}, v.Version)
	u, err := dlpack.ExportUnversioned(b)
	require.NoError(t, err)
	assert.Equal(t, 2, b.Holds(), "each export holds the memory")
	require.NoError(t, dlpack.Delete(addr(v)))
	require.NoError(t, dlpack.DeleteUnversioned(addr(u)))
	assert.Zero(t, b.Holds())

	_, err = dlpack.ExportUnversioned(b, dlpack.ReadOnly())
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "no flags to carry read-only")
	_, err = dlpack.Export(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = dlpack.Export(new(buffer.Buffer))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = dlpack.Export(buffer.FromPointer(0, 8))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a range no memory has")
	c := h.alloc(t, 8)
	require.NoError(t, c.Close())
	_, err = dlpack.Export(c)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.ErrorContains(t, err, "dlpack.Export")
	assert.Zero(t, dlpack.Live())
}

// TestExportFields checks the tensor as Go and as C read it.
func TestExportFields(t *testing.T) {
	l := needC(t)
	h := newHeap()
	b := h.alloc(t, 300)
	defer b.Close()

	v, err := dlpack.Export(b, dlpack.ReadOnly())
	require.NoError(t, err)
	assert.Equal(t, uintptr(b.Ptr()), v.Tensor.Data)
	assert.Equal(t, dlpack.Device{Type: dlpack.CPU}, v.Tensor.Device)
	assert.Equal(t, int32(1), v.Tensor.NDim)
	assert.Equal(t, dlpack.Byte, v.Tensor.DType)
	assert.Zero(t, v.Tensor.Strides)
	assert.Zero(t, v.Tensor.ByteOffset)
	assert.Equal(t, dlpack.FlagReadOnly, v.Flags)
	assert.NotZero(t, v.Deleter)
	assert.NotZero(t, v.ManagerCtx)
	f := l.Describe(addr(v), true)
	assert.Equal(t, [13]int64{1, 1, 1, 1, 0, 1, 1, 8, 1, 300, 0, 0, int64(b.Ptr())},
		[13]int64{f.Major, f.Minor, f.Flags, f.DevType, f.DevID, f.NDim, f.Code, f.Bits, f.Lanes, f.Shape0, f.HasStrides, f.ByteOffset, f.Data})
	l.Delete(addr(v), true)

	u, err := dlpack.ExportUnversioned(b)
	require.NoError(t, err)
	f = l.Describe(addr(u), false)
	assert.Equal(t, [10]int64{1, 0, 1, 1, 8, 1, 300, 0, 0, int64(b.Ptr())},
		[10]int64{f.DevType, f.DevID, f.NDim, f.Code, f.Bits, f.Lanes, f.Shape0, f.HasStrides, f.ByteOffset, f.Data})
	l.Delete(addr(u), false)
	assert.Zero(t, b.Holds())

	// A view exports its own range; an empty buffer a null data pointer.
	w, err := b.Slice(100, 50)
	require.NoError(t, err)
	vw, err := dlpack.Export(w)
	require.NoError(t, err)
	assert.Equal(t, uintptr(b.Ptr())+100, vw.Tensor.Data)
	assert.Equal(t, int64(50), l.Describe(addr(vw), true).Shape0)
	l.Delete(addr(vw), true)
	e := h.alloc(t, 0)
	defer e.Close()
	ve, err := dlpack.Export(e)
	require.NoError(t, err)
	assert.Zero(t, ve.Tensor.Data, "an empty tensor's data is NULL")
	assert.Equal(t, int64(0), l.Describe(addr(ve), true).Shape0)
	l.Delete(addr(ve), true)
}

// TestExportDeleterFromC calls the deleter from C: on the calling thread,
// on a thread the C library made, and on many at once.
func TestExportDeleterFromC(t *testing.T) {
	l := needC(t)
	for _, versioned := range []bool{true, false} {
		h := newHeap()
		b := h.alloc(t, 64)
		export := func() uintptr {
			if versioned {
				v, err := dlpack.Export(b)
				require.NoError(t, err)
				return addr(v)
			}
			u, err := dlpack.ExportUnversioned(b)
			require.NoError(t, err)
			return addr(u)
		}
		p := export()
		l.Delete(p, versioned)
		assert.Zero(t, b.Holds(), "same thread")

		p = export()
		require.NoError(t, l.DeleteOnThread(p, versioned))
		assert.Zero(t, b.Holds(), "a C thread")

		ps := make([]uintptr, 32)
		for i := range ps {
			ps[i] = export()
		}
		assert.Equal(t, 32, b.Holds())
		require.NoError(t, l.DeleteOnThreads(ps, versioned))
		assert.Zero(t, b.Holds(), "32 C threads at once")
		assert.Zero(t, dlpack.Live())
		require.NoError(t, b.Close())
		assert.Equal(t, 1, h.freed())
	}
}

// TestExportDeleterOnce calls a deleter twice, and the deleter function
// with pointers that were never exported: nothing happens but a count.
func TestExportDeleterOnce(t *testing.T) {
	l := needC(t)
	h := newHeap()
	b := h.alloc(t, 64)
	v, err := dlpack.Export(b)
	require.NoError(t, err)
	fn := v.Deleter
	h2, err := b.Hold("second hold")
	require.NoError(t, err)

	strays := dlpack.StrayDeletes()
	l.Delete(addr(v), true)
	assert.Equal(t, 1, b.Holds(), "the export's hold is gone, the test's is not")
	assert.Zero(t, v.Deleter, "a released tensor is zeroed")
	assert.Zero(t, v.Tensor.Data)
	_, err = dlpack.Import(addr(v))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a released tensor imports as garbage, harmlessly")
	l.DeleteRaw(fn, addr(v)) // a second call, after the deleter field was cleared
	assert.Equal(t, 1, b.Holds(), "a second call releases nothing")
	var garbage [16]uintptr
	l.DeleteRaw(fn, addr(&garbage[0]))
	l.DeleteRaw(fn, 0)
	l.DeleteRaw(fn, 0xdead_b000)
	assert.Equal(t, strays+4, dlpack.StrayDeletes())
	assert.Equal(t, 1, b.Holds())

	// A tensor whose manager_ctx the consumer overwrote is not released.
	w, err := dlpack.Export(b)
	require.NoError(t, err)
	ctx := w.ManagerCtx
	w.ManagerCtx = 12345
	l.Delete(addr(w), true)
	assert.Equal(t, 2, b.Holds(), "a tampered tensor stays live")
	assert.Equal(t, strays+5, dlpack.StrayDeletes())
	w.ManagerCtx = ctx
	l.Delete(addr(w), true)
	assert.Equal(t, 1, b.Holds())

	require.NoError(t, h2.Release())
	require.NoError(t, b.Close())
	assert.Equal(t, 1, h.freed())
}

// TestExportCloseBeforeDeleter: Close returns nil and closes the Buffer,
// the memory stays for the consumer, and the deleter frees it.
func TestExportCloseBeforeDeleter(t *testing.T) {
	l := needC(t)
	for _, thread := range []bool{false, true} {
		h := newHeap()
		b := h.alloc(t, 100)
		v, err := dlpack.Export(b)
		require.NoError(t, err)
		require.NoError(t, b.Close(), "Close of an exported buffer succeeds")
		assert.True(t, b.IsClosed())
		_, err = b.Bytes()
		assert.ErrorIs(t, err, cuda.ErrClosed, "closed for Go")
		_, err = dlpack.Export(b)
		assert.ErrorIs(t, err, cuda.ErrClosed)
		assert.Zero(t, h.freed(), "not freed under the consumer")

		l.Fill(addr(v), true, 3) // the consumer still uses the memory
		assert.Equal(t, uint64(300), l.Sum(addr(v), true))
		if thread {
			require.NoError(t, l.DeleteOnThread(addr(v), true))
		} else {
			l.Delete(addr(v), true)
		}
		assert.Equal(t, 1, h.freed(), "the deleter freed it")
		assert.Zero(t, h.live())
		require.NoError(t, b.Close())
		assert.Equal(t, 1, h.freed())
	}
}

// TestExportCloseAfterDeleter: the deleter frees nothing of an open
// buffer; Close then frees as usual.
func TestExportCloseAfterDeleter(t *testing.T) {
	l := needC(t)
	h := newHeap()
	b := h.alloc(t, 100)
	u, err := dlpack.ExportUnversioned(b)
	require.NoError(t, err)
	l.Fill(addr(u), false, 1)
	l.Delete(addr(u), false)
	assert.Zero(t, h.freed())
	got, err := b.Bytes()
	require.NoError(t, err)
	assert.Equal(t, byte(1), got[99], "the consumer's writes are in the buffer")
	require.NoError(t, b.Close())
	assert.Equal(t, 1, h.freed())
}

// TestExportRace exports, closes and deletes from many goroutines: every
// buffer is freed exactly once, after its Close and all its deleters.
// Most deleters are called back on the goroutine's own thread from inside
// a C call (Go -> C -> deleter), the rest from C threads. Meanwhile a loop
// of garbage collections shrinks the goroutines' stacks (each first grows
// its stack, and the deleter waits for its release), so the stack under a
// C call moves while the callback runs: the C call's result must still
// come back (it did not before the loader's trampoline found its moved
// record, and under -race the stray write corrupted the heap).
func TestExportRace(t *testing.T) {
	l := needC(t)
	h := newHeap()
	stop := make(chan struct{})
	var gc sync.WaitGroup
	gc.Add(1)
	go func() {
		defer gc.Done()
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				_ = growStack(32) // leave a large stack for the collector to shrink
				b, _ := buffer.Allocate(h, 32, nil)
				var ps []uintptr
				for range 3 {
					v, err := dlpack.Export(b)
					if err != nil {
						t.Errorf("Export: %v", err)
						return
					}
					ps = append(ps, addr(v))
				}
				if (g+i)%2 == 0 {
					_ = b.Close()
				}
				for j, p := range ps {
					if (g+i+j)%3 == 2 {
						if err := l.DeleteOnThread(p, true); err != nil {
							t.Errorf("DeleteOnThread: %v", err)
						}
						continue
					}
					tag := uint64(1)<<63 | uint64(g)<<32 | uint64(i)<<8 | uint64(j)
					if got := l.DeleteTagged(p, true, tag); got != tag {
						t.Errorf("goroutine %d, round %d: a C call that ran the deleter returned %#x, want %#x", g, i, got, tag)
					}
				}
				_ = b.Close()
			}
		}()
	}
	wg.Wait()
	close(stop)
	gc.Wait()
	assert.Equal(t, 8*50, h.freed())
	assert.Zero(t, h.live())
	assert.Zero(t, dlpack.Live())
}

// growStack uses about n KiB of goroutine stack (and returns a byte of it, so
// that the frames are not optimized away).
//
//go:noinline
func growStack(n int) byte {
	var pad [1024]byte
	pad[n%1024] = byte(n)
	if n > 0 {
		return growStack(n-1) + pad[(n*7)%1024]
	}
	return pad[0]
}

// TestNotSupportedElsewhere: where DLPack cannot work, every call says
// so, and nothing is held.
func TestNotSupportedElsewhere(t *testing.T) {
	if isSupported() {
		t.Skip("DLPack works here")
	}
	b := newHeap().alloc(t, 8)
	defer b.Close()
	_, err := dlpack.Export(b)
	assert.ErrorIs(t, err, cuda.ErrNotSupported)
	_, err = dlpack.ExportUnversioned(b)
	assert.ErrorIs(t, err, cuda.ErrNotSupported)
	_, err = dlpack.Import(0x1000)
	assert.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.ErrorIs(t, dlpack.Delete(0x1000), cuda.ErrNotSupported)
	assert.Zero(t, b.Holds())
}
