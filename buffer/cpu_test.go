package buffer_test

import (
	"errors"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// These tests need no driver: they run on every machine, and on a GPU
// machine fake addresses never reach the driver (every path they take
// fails or finishes in Go first).

func TestFakeCloseIdempotent(t *testing.T) {
	mr := newFake()
	b := mr.alloc(1024)
	p := b.Ptr()
	require.NotZero(t, p)
	assert.True(t, b.IsOwned())
	assert.False(t, b.IsClosed())
	assert.Same(t, mr, b.Resource())

	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	require.NoError(t, b.CloseOn(nil))
	assert.True(t, mr.wasFreed(p))
	assert.Len(t, mr.freed, 1, "freed once")
	assert.True(t, b.IsClosed())
	assert.Zero(t, b.Ptr())
	assert.Nil(t, b.Resource())
	assert.Equal(t, uint64(1024), b.Size(), "the size stays readable")
	assert.Equal(t, "Buffer(closed, 1024 bytes)", b.String())
}

func TestFakeCloseOnStream(t *testing.T) {
	// Stream values that are never used: the fake only records them.
	alloc, other := new(cuda.Stream), new(cuda.Stream)
	mr := newFake()

	a, err := buffer.Allocate(mr, 64, alloc)
	require.NoError(t, err)
	assert.Same(t, alloc, a.Stream())
	require.NoError(t, a.Close())
	assert.Nil(t, a.Stream(), "a closed buffer keeps no stream")

	b, err := buffer.Allocate(mr, 64, alloc)
	require.NoError(t, err)
	require.NoError(t, b.CloseOn(other))
	require.NoError(t, b.CloseOn(alloc), "idempotent, whatever the stream")

	require.Len(t, mr.streams, 2)
	assert.Same(t, alloc, mr.streams[0], "Close frees on the allocation stream")
	assert.Same(t, other, mr.streams[1], "CloseOn frees on the stream given")
}

func TestFakeCloseFailureCanRetry(t *testing.T) {
	mr := newFake()
	b := mr.alloc(32)
	mr.failFrees = 1
	err := b.Close()
	require.ErrorIs(t, err, errFakeFree)
	assert.Contains(t, err.Error(), "32 bytes")
	assert.False(t, b.IsClosed(), "a failed close leaves the buffer usable")
	require.NoError(t, b.Close())
	assert.True(t, b.IsClosed())
	assert.Zero(t, mr.liveCount())
}

func TestFakeBorrowed(t *testing.T) {
	b := buffer.FromPointer(0xdead0000, 128)
	assert.False(t, b.IsOwned())
	assert.Nil(t, b.Resource())
	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	assert.True(t, b.IsClosed())
	assert.Equal(t, -1, b.DeviceID(), "closed: bound to no device, and the driver is not asked")
	assert.False(t, b.DeviceAccessible())
	assert.False(t, b.HostAccessible())
}

func TestFakeAccessorsFromResource(t *testing.T) {
	mr := newFake()
	mr.device, mr.devAcc, mr.hostAcc = 3, true, true
	b := mr.alloc(16)
	assert.Equal(t, 3, b.DeviceID())
	assert.True(t, b.DeviceAccessible())
	assert.True(t, b.HostAccessible())
	v, err := b.Slice(4, 4)
	require.NoError(t, err)
	assert.Equal(t, 3, v.DeviceID(), "views report their owner's memory")
	require.NoError(t, b.Close())
	assert.Equal(t, -1, b.DeviceID())
	assert.False(t, b.DeviceAccessible())
	assert.False(t, b.HostAccessible())
	assert.Equal(t, -1, v.DeviceID())
}

// Every method but Close, on a closed buffer, fails with ErrClosed.
func TestFakeClosedBufferErrors(t *testing.T) {
	mr := newFake()
	open := mr.alloc(64)
	defer open.Close()

	closedOwner := mr.alloc(64)
	viewOfClosed, err := closedOwner.Slice(0, 64)
	require.NoError(t, err)
	require.NoError(t, closedOwner.Close())

	owner := mr.alloc(128)
	defer owner.Close()
	closedView, err := owner.Slice(64, 64)
	require.NoError(t, err)
	subView, err := closedView.Slice(0, 64)
	require.NoError(t, err)
	require.NoError(t, closedView.Close())

	borrowed := buffer.FromPointer(0xdead0000, 64)
	require.NoError(t, borrowed.Close())

	for name, b := range map[string]*buffer.Buffer{
		"owner": closedOwner, "view of closed owner": viewOfClosed,
		"closed view": closedView, "view of closed view": subView, "borrowed": borrowed,
	} {
		t.Run(name, func(t *testing.T) {
			assert.True(t, b.IsClosed())
			assert.Zero(t, b.Ptr())
			calls := map[string]func() error{
				"CopyTo":        func() error { return b.CopyTo(open, nil) },
				"CopyTo(dst)":   func() error { return open.CopyTo(b, nil) },
				"CopyFrom":      func() error { return b.CopyFrom(open, nil) },
				"CopyFrom(src)": func() error { return open.CopyFrom(b, nil) },
				"Clone":         func() error { _, err := b.Clone(mr, nil); return err },
				"CopyFromHost":  func() error { return buffer.CopyFromHost(b, make([]byte, 64), nil) },
				"CopyToHost":    func() error { return buffer.CopyToHost(make([]byte, 64), b, nil) },
				"ReadAt":        func() error { _, err := b.ReadAt(make([]byte, 8), 0); return err },
				"WriteAt":       func() error { _, err := b.WriteAt(make([]byte, 8), 0); return err },
				"Fill8":         func() error { return b.Fill8(1, nil) },
				"Fill16":        func() error { return b.Fill16(1, nil) },
				"Fill32":        func() error { return b.Fill32(1, nil) },
				"Bytes":         func() error { _, err := b.Bytes(); return err },
				"Slice":         func() error { _, err := b.Slice(0, 1); return err },
				"Device":        func() error { _, err := b.Device(); return err },
			}
			for call, f := range calls {
				err := f()
				assert.ErrorIs(t, err, cuda.ErrClosed, "%s on a closed buffer", call)
			}
			assert.NoError(t, b.Close(), "Close stays idempotent")
			assert.NoError(t, b.CloseOn(nil))
		})
	}
	assert.Equal(t, 2, mr.liveCount(), "only the two open owners are live")
}

func TestFakeSizeMismatch(t *testing.T) {
	mr := newFake()
	a, b := mr.alloc(1024), mr.alloc(2048)
	defer a.Close()
	defer b.Close()

	err := a.CopyTo(b, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "buffer sizes mismatch between src and dst (sizes are: src=1024, dst=2048)")
	err = a.CopyFrom(b, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "buffer sizes mismatch between src and dst (sizes are: src=2048, dst=1024)")

	err = buffer.CopyFromHost(a, make([]float32, 3), nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "(sizes are: src=12, dst=1024)")
	err = buffer.CopyToHost(make([]uint16, 3), b, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "(sizes are: src=2048, dst=6)")

	var nilBuf *buffer.Buffer
	assert.ErrorIs(t, a.CopyTo(nilBuf, nil), cuda.ErrInvalidArgument)
	assert.ErrorIs(t, buffer.CopyFromHost(nilBuf, []byte{1}, nil), cuda.ErrInvalidArgument)
}

// Zero-length work is done in Go: no stream is resolved, so no driver.
func TestFakeCopyOverlap(t *testing.T) {
	mr := newFake()
	b := mr.alloc(100)
	defer b.Close()
	x, _ := b.Slice(0, 50)
	y, _ := b.Slice(40, 50)
	err := x.CopyTo(y, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "overlap")
	err = x.CopyFrom(x, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	// Disjoint views pass the check (and then fail resolving the fake's
	// device, before any driver call).
	z, _ := b.Slice(50, 50)
	err = x.CopyTo(z, nil)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "overlap")
}

func TestFakeZeroLength(t *testing.T) {
	mr := newFake()
	a, b := mr.alloc(0), mr.alloc(0)
	defer a.Close()
	defer b.Close()
	assert.NoError(t, a.CopyTo(b, nil))
	assert.NoError(t, a.CopyFrom(b, nil))
	assert.NoError(t, buffer.CopyFromHost(a, []float64{}, nil))
	assert.NoError(t, buffer.CopyToHost([]byte(nil), a, nil))
	assert.NoError(t, a.Fill8(1, nil))
	assert.NoError(t, a.Fill32(1, nil))
	n, err := a.WriteAt(nil, 0)
	assert.NoError(t, err)
	assert.Zero(t, n)

	c := mr.alloc(16)
	defer c.Close()
	n, err = c.ReadAt(nil, 8)
	assert.NoError(t, err, "an empty read inside the buffer")
	assert.Zero(t, n)
	v, err := c.Slice(16, 0)
	require.NoError(t, err, "an empty view at the end")
	assert.NoError(t, v.Fill16(7, nil))
}

func TestFakeFillChecks(t *testing.T) {
	mr := newFake()
	b := mr.alloc(6)
	defer b.Close()
	err := b.Fill32(1, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "buffer size 6 is not a multiple of the fill width 4")
	// 6 is a multiple of 2: the call goes on to resolve the stream, and
	// fails there (no driver here, or no device noDevice on a GPU machine).
	err = b.Fill16(1, nil)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "fill width")

	c := mr.alloc(64)
	defer c.Close()
	v, err := c.Slice(1, 8)
	require.NoError(t, err)
	err = v.Fill16(1, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Regexp(t, `buffer address 0x[0-9a-f]+ is not aligned to the fill width 2`, err.Error())
	v, err = c.Slice(2, 8)
	require.NoError(t, err)
	err = v.Fill32(1, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "not aligned to the fill width 4")
}

func TestFakeViews(t *testing.T) {
	mr := newFake()
	owner := mr.alloc(1000)
	base := owner.Ptr()

	v, err := owner.Slice(100, 200)
	require.NoError(t, err)
	assert.Equal(t, base+100, v.Ptr())
	assert.Equal(t, uint64(200), v.Size())
	assert.False(t, v.IsOwned(), "views never free")
	assert.Same(t, mr, v.Resource())

	vv, err := v.Slice(50, 150)
	require.NoError(t, err, "a view of a view")
	assert.Equal(t, base+150, vv.Ptr(), "offsets add up")
	assert.Equal(t, uint64(150), vv.Size())

	for _, c := range []struct{ off, n uint64 }{{0, 1001}, {1000, 1}, {1001, 0}, {999, 2}, {1, 1<<64 - 1}, {1<<64 - 1, 2}} {
		_, err := owner.Slice(c.off, c.n)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "off=%d n=%d", c.off, c.n)
		assert.Contains(t, err.Error(), "off="+itoa(c.off)+", n="+itoa(c.n))
		assert.Contains(t, err.Error(), "size 1000")
	}
	_, err = v.Slice(0, 201)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument, "bounded by the view, not the owner")
	assert.Contains(t, err.Error(), "size 200")

	// Closing a view ends it and its sub-views, not the owner or siblings.
	sibling, err := owner.Slice(0, 10)
	require.NoError(t, err)
	require.NoError(t, v.Close())
	assert.True(t, v.IsClosed())
	assert.True(t, vv.IsClosed())
	assert.False(t, owner.IsClosed())
	assert.False(t, sibling.IsClosed())
	assert.Empty(t, mr.freed, "closing views frees nothing")

	require.NoError(t, owner.Close())
	assert.True(t, sibling.IsClosed(), "closing the owner ends every view")
	_, err = sibling.Slice(0, 1)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Len(t, mr.freed, 1)
}

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v /= 10 {
		b = append([]byte{byte('0' + v%10)}, b...)
	}
	return string(b)
}

func TestFakeReadAtWriteAtBounds(t *testing.T) {
	mr := newFake()
	b := mr.alloc(16)
	defer b.Close()
	var _ io.ReaderAt = b
	var _ io.WriterAt = b

	n, err := b.ReadAt(make([]byte, 4), 16)
	assert.Zero(t, n)
	assert.Equal(t, io.EOF, err, "reading at the end")
	n, err = b.ReadAt(make([]byte, 4), 100)
	assert.Zero(t, n)
	assert.Equal(t, io.EOF, err, "reading past the end")
	_, err = b.ReadAt(make([]byte, 4), -1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)

	n, err = b.WriteAt(make([]byte, 8), 12)
	assert.Zero(t, n)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "writing 8 bytes at offset 12 overruns a 16-byte buffer")
	_, err = b.WriteAt(make([]byte, 1), 17)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = b.WriteAt(make([]byte, 1), -3)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestFakePlainDataOnly(t *testing.T) {
	type plain struct {
		X, Y float32
		N    [3]uint16
		_    [2]byte
		Ok   bool
		C    complex64
	}
	type hidden struct {
		A int32
		B struct{ In [2][]byte }
	}
	mr := newFake()
	b := mr.alloc(8)
	defer b.Close()
	reject := map[string]func() error{
		"*int":    func() error { return buffer.CopyFromHost(b, []*int{nil}, nil) },
		"string":  func() error { return buffer.CopyFromHost(b, []string{""}, nil) },
		"[]byte":  func() error { return buffer.CopyToHost([][]byte{nil}, b, nil) },
		"any":     func() error { return buffer.CopyToHost([]any{nil}, b, nil) },
		"map":     func() error { return buffer.CopyFromHost(b, []map[int]int{nil}, nil) },
		"chan":    func() error { return buffer.CopyFromHost(b, []chan int{nil}, nil) },
		"func":    func() error { return buffer.CopyFromHost(b, []func(){nil}, nil) },
		"[2]*int": func() error { return buffer.CopyFromHost(b, [][2]*int{{}}, nil) },
		"hidden":  func() error { return buffer.CopyToHost([]hidden{{}}, b, nil) },
	}
	for name, f := range reject {
		err := f()
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		assert.Contains(t, err.Error(), "holds Go pointers", name)
	}
	err := buffer.CopyToHost([]hidden{{}}, b, nil)
	assert.Contains(t, err.Error(), "buffer_test.hidden")
	assert.Contains(t, err.Error(), "B.In[i] is a slice", "the message points at the field")

	// Plain types pass the check and stop at the size check instead.
	for name, err := range map[string]error{
		"float32": buffer.CopyFromHost(b, []float32{1}, nil),
		"plain":   buffer.CopyToHost([]plain{{}}, b, nil),
		"[0]*int": buffer.CopyFromHost(b, [][0]*int{{}}, nil),
		"uintptr": buffer.CopyFromHost(b, []uintptr{1, 2, 3}, nil),
	} {
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		assert.Contains(t, err.Error(), "sizes mismatch", name)
	}
}

// cuda.core's host dummy resource: Go heap memory, viewable with Bytes.
func TestFakeBytesHostMemory(t *testing.T) {
	mr := newHeap()
	b, err := buffer.Allocate(mr, 64, nil)
	require.NoError(t, err)
	defer b.Close()
	p, err := b.Bytes()
	require.NoError(t, err)
	require.Len(t, p, 64)
	for i := range p {
		p[i] = byte(i)
	}
	v, err := b.Slice(10, 4)
	require.NoError(t, err)
	q, err := v.Bytes()
	require.NoError(t, err)
	assert.Equal(t, []byte{10, 11, 12, 13}, q, "a view's bytes are its owner's")

	_, err = b.Device()
	require.ErrorIs(t, err, cuda.ErrInvalidArgument, "host memory belongs to no device")
	assert.Contains(t, err.Error(), "belongs to no device")

	e, err := buffer.Allocate(mr, 0, nil)
	require.NoError(t, err)
	p, err = e.Bytes()
	require.NoError(t, err)
	assert.Empty(t, p)
	require.NoError(t, e.Close())

	dev := newFake()
	d := dev.alloc(64)
	defer d.Close()
	_, err = d.Bytes()
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "not host-accessible")
}

func TestFakeCloneNeedsResource(t *testing.T) {
	b := buffer.FromPointer(0xdead0000, 64)
	defer b.Close()
	_, err := b.Clone(nil, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "a destination resource must be given")
}

func TestFakeNilBuffer(t *testing.T) {
	var b *buffer.Buffer
	assert.NoError(t, b.Close())
	assert.True(t, b.IsClosed())
	assert.ErrorIs(t, b.Fill8(0, nil), cuda.ErrInvalidArgument)
	_, err := b.Slice(0, 0)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = b.Bytes()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// dropOwned allocates and forgets a buffer; it returns the address.
//
//go:noinline
func dropOwned(mr buffer.MemoryResource, size uint64) cuda.DevicePtr {
	b, err := buffer.Allocate(mr, size, nil)
	if err != nil {
		panic(err)
	}
	return b.Ptr()
}

// dropOwnerKeepView allocates a buffer and returns only a view of it.
//
//go:noinline
func dropOwnerKeepView(mr buffer.MemoryResource) *buffer.Buffer {
	b, err := buffer.Allocate(mr, 256, nil)
	if err != nil {
		panic(err)
	}
	v, err := b.Slice(128, 64)
	if err != nil {
		panic(err)
	}
	return v
}

// An owned buffer dropped without Close is freed by the cleanup and
// counted; closed and borrowed buffers are not.
func TestLeaksSafetyNet(t *testing.T) {
	mr := newFake()
	before := buffer.Leaks()

	p := dropOwned(mr, 512)
	expectedLeaks.Add(1)
	collectUntil(t, "the dropped buffer was not freed", func() bool { return mr.wasFreed(p) })
	assert.Equal(t, before+1, buffer.Leaks())
	assert.Zero(t, mr.liveCount())
	assert.Nil(t, mr.streams[0], "freed on its allocation stream (none)")

	// Closed then dropped: not a leak. Borrowed: nothing to free.
	func() {
		b := mr.alloc(64)
		require.NoError(t, b.Close())
		_ = buffer.FromPointer(0xdead0000, 8)
	}()
	for range 5 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, before+1, buffer.Leaks())
	assert.Len(t, mr.freed, 2)
}

// Buffers come from per-P slab cursors: with GOMAXPROCS raised, pairs
// from many goroutines work (the cursors' growth itself is
// TestCursorsGrowWithGOMAXPROCS's), and a Buffer leaked by a goroutine
// whose P then makes no more Buffers is still freed (its cursor gives up
// the slab at the next collection).
func TestLeaksAfterGOMAXPROCSGrows(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 6))
	mr := newFake()
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				b, err := buffer.Allocate(mr, 64, nil)
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, b.Close())
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, mr.liveCount())

	before := buffer.Leaks()
	var (
		mu sync.Mutex
		ps []cuda.DevicePtr
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := dropOwned(mr, 128) // one Buffer, the rest of its slab unused
			mu.Lock()
			ps = append(ps, p)
			mu.Unlock()
		}()
	}
	wg.Wait()
	expectedLeaks.Add(int64(len(ps)))
	collectUntil(t, "a dropped buffer was not freed", func() bool {
		for _, p := range ps {
			if !mr.wasFreed(p) {
				return false
			}
		}
		return true
	})
	assert.Equal(t, before+int64(len(ps)), buffer.Leaks())
	assert.Zero(t, mr.liveCount())
}

func TestLeaksViewKeepsOwnerAlive(t *testing.T) {
	mr := newFake()
	before := buffer.Leaks()
	v := dropOwnerKeepView(mr)
	for range 5 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, 1, mr.liveCount(), "the view keeps its owner alive")
	assert.False(t, v.IsClosed())
	runtime.KeepAlive(v)

	v = nil
	expectedLeaks.Add(1)
	collectUntil(t, "the owner was not freed after its last view went", func() bool { return mr.liveCount() == 0 })
	assert.Equal(t, before+1, buffer.Leaks())
}

// Close waits for calls in progress and every call either completes or
// sees ErrClosed; run with -race.
func TestFakeConcurrentUseAndClose(t *testing.T) {
	mr := newHeap()
	for range 20 {
		b, err := buffer.Allocate(mr, 4096, nil)
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					v, err := b.Slice(uint64(g*8+i), 16)
					if err == nil {
						_, err = v.Bytes()
					}
					if err != nil {
						if !errors.Is(err, cuda.ErrClosed) {
							errs <- err
						}
						return
					}
				}
			}()
		}
		require.NoError(t, b.Close())
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	assert.Equal(t, 20, mr.free)
}

func TestNilBufferAccessorsDoNotPanic(t *testing.T) {
	var b *buffer.Buffer
	assert.Zero(t, b.Ptr())
	assert.Zero(t, b.Size())
	assert.Nil(t, b.Resource())
	assert.Nil(t, b.Stream())
	assert.False(t, b.IsOwned())
	assert.True(t, b.IsClosed())
	assert.Equal(t, "Buffer(nil)", b.String())
	assert.NoError(t, b.Close())
	assert.ErrorIs(t, b.Fill32(0, nil), cuda.ErrInvalidArgument)
}

// A Deallocate error wrapping ErrPartlyFreed means the memory is gone:
// the buffer is closed anyway (never left open over freed memory, where a
// retried Close would free it twice), the error is returned, and the
// buffer refuses every later use with ErrClosed. Any other Deallocate
// error leaves the buffer open, so Close can be retried.
func TestFakeClosePartlyFreed(t *testing.T) {
	for _, how := range []string{"Close", "CloseOn"} {
		t.Run(how, func(t *testing.T) {
			mr := newFake()
			b := mr.alloc(48)
			p := b.Ptr()
			v, err := b.Slice(16, 16)
			require.NoError(t, err)
			mr.partlyFrees = 1
			if how == "Close" {
				err = b.Close()
			} else {
				err = b.CloseOn(new(cuda.Stream))
			}
			require.Error(t, err, "the failed cleanup is reported")
			assert.ErrorIs(t, err, buffer.ErrPartlyFreed)
			assert.Contains(t, err.Error(), "48 bytes", "the error names the buffer")
			assert.True(t, b.IsClosed(), "closed: its memory is gone")
			assert.Zero(t, b.Ptr())
			assert.True(t, mr.wasFreed(p))
			assert.Zero(t, mr.liveCount())

			require.NoError(t, b.Close(), "closing again is a no-op")
			assert.Len(t, mr.freed, 1, "and never frees twice")
			_, err = b.Slice(0, 8)
			assert.ErrorIs(t, err, cuda.ErrClosed)
			assert.ErrorIs(t, b.Fill8(1, nil), cuda.ErrClosed)
			assert.ErrorIs(t, buffer.CopyFromHost(b, make([]byte, 48), nil), cuda.ErrClosed)
			assert.ErrorIs(t, buffer.CopyFromHost(v, make([]byte, 16), nil), cuda.ErrClosed, "views of it too")
		})
	}

	// Any other Deallocate error, even one that reads alike, leaves the
	// buffer open and usable for a retry.
	mr := newFake()
	b := mr.alloc(32)
	mr.failFrees = 1
	err := b.Close()
	require.ErrorIs(t, err, errFakeFree)
	assert.NotErrorIs(t, err, buffer.ErrPartlyFreed)
	assert.False(t, b.IsClosed(), "open: the memory is still allocated")
	assert.NotZero(t, b.Ptr())
	v, err := b.Slice(0, 8)
	require.NoError(t, err, "still usable")
	require.NoError(t, v.Close())
	require.NoError(t, b.Close(), "the retry frees it")
	assert.True(t, b.IsClosed())
	assert.Zero(t, mr.liveCount())
	assert.Len(t, mr.freed, 1)
}
