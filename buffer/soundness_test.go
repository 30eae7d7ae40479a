package buffer_test

import (
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Soundness tests of issue 6: no deadlock, no use after free from safe
// code, no panic on nil and zero values, no unchecked arithmetic. They
// need no driver.

// waitAll waits for n values on ch, or fails the test after d: a deadlock
// must fail, not hang the run.
func waitAll[T any](t *testing.T, ch <-chan T, n int, d time.Duration, what string) []T {
	t.Helper()
	timeout := time.After(d)
	var got []T
	for range n {
		select {
		case v := <-ch:
			got = append(got, v)
		case <-timeout:
			t.Fatalf("deadlock: %s: %d of %d finished after %v", what, len(got), n, d)
		}
	}
	return got
}

func closedOrNil(err error) bool { return err == nil || errors.Is(err, cuda.ErrClosed) }

// Issue 6, deadlock: each goroutine holds one buffer (inside Use) and then
// takes the other, while both buffers are being closed. With read locks, a
// Close waiting for the first buffer blocked the other goroutine's second
// acquire, and the reverse: all four goroutines hung. The second acquire
// must instead fail with ErrClosed (or succeed), and everything finish.
func TestNoDeadlockCrosswiseClose(t *testing.T) {
	mr := newFake()
	inner := map[string]func(x, y *buffer.Buffer) error{
		"Use":    func(_, y *buffer.Buffer) error { return y.Use("test", func(cuda.DevicePtr) error { return nil }) },
		"Slice":  func(_, y *buffer.Buffer) error { _, err := y.Slice(0, 8); return err },
		"Bytes":  func(_, y *buffer.Buffer) error { _, err := y.Bytes(); return err },
		"CopyTo": func(x, y *buffer.Buffer) error { return y.CopyTo(x, nil) },
	}
	for name, f := range inner {
		t.Run(name, func(t *testing.T) {
			for range 5 {
				a, b := mr.alloc(64), mr.alloc(64)
				held := make(chan struct{}, 2)
				proceed := make(chan struct{})
				done := make(chan error, 4)
				cross := func(x, y *buffer.Buffer) {
					done <- x.Use("test", func(cuda.DevicePtr) error {
						held <- struct{}{}
						<-proceed
						return f(x, y)
					})
				}
				go cross(a, b)
				go cross(b, a)
				waitAll(t, held, 2, 5*time.Second, "entering Use")
				go func() { done <- a.Close() }()
				go func() { done <- b.Close() }()
				// Let both Closes reach the lock and wait there for the Uses.
				time.Sleep(20 * time.Millisecond)
				close(proceed)
				for _, err := range waitAll(t, done, 4, 10*time.Second, "crosswise calls and Closes") {
					// A copy of fake memory fails resolving its device
					// (no driver, or no device noDevice): any error
					// will do but a hang.
					if name != "CopyTo" {
						assert.True(t, closedOrNil(err), "%v", err)
					}
				}
				assert.True(t, a.IsClosed())
				assert.True(t, b.IsClosed())
			}
		})
	}
	assert.Zero(t, mr.liveCount())
}

// The same with copies between buffers and views of them, from several
// goroutines crosswise while both buffers are closed, many times. A copy
// of fake memory holds both buffers, then fails resolving the device (no
// driver here, no device noDevice on a GPU machine); only ErrClosed ends
// a goroutine's loop.
func TestNoDeadlockCrosswiseCopyStress(t *testing.T) {
	mr := newFake()
	deadline := time.Now().Add(2 * time.Second)
	rounds := 0
	for ; rounds < 5000 && time.Now().Before(deadline); rounds++ {
		a, b := mr.alloc(64), mr.alloc(64)
		done := make(chan error, 6)
		hammer := func(x, y *buffer.Buffer, views bool) {
			for {
				err := x.CopyTo(y, nil)
				if views && !errors.Is(err, cuda.ErrClosed) {
					var v *buffer.Buffer
					if v, err = y.Slice(32, 32); err == nil {
						err = v.CopyFrom(v, nil) // overlapping: refused after both acquires
					}
				}
				if errors.Is(err, cuda.ErrClosed) {
					done <- nil
					return
				}
			}
		}
		go hammer(a, b, false)
		go hammer(b, a, false)
		go hammer(a, b, true)
		go hammer(b, a, true)
		go func() { done <- a.Close() }()
		go func() { done <- b.Close() }()
		for _, err := range waitAll(t, done, 6, 10*time.Second, fmt.Sprintf("round %d", rounds)) {
			require.NoError(t, err)
		}
	}
	t.Logf("%d rounds", rounds)
	assert.Zero(t, mr.liveCount())
}

// hostMem is host memory from Go, with frees recorded: a stand-in for
// pinned memory, whose Bytes hand out slices.
type hostMem struct {
	heapResource
	fmu   sync.Mutex
	freed map[uintptr]bool
}

func newHostMem() *hostMem {
	return &hostMem{heapResource: heapResource{mem: map[cuda.DevicePtr][]byte{}}, freed: map[uintptr]bool{}}
}

func (m *hostMem) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return m.heapResource.AllocatePtr(size, s) // frees come back to m's Deallocate
}

func (m *hostMem) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if err := m.heapResource.Deallocate(p, size, s); err != nil {
		return err
	}
	m.fmu.Lock()
	m.freed[uintptr(p)] = true
	m.fmu.Unlock()
	return nil
}

func (m *hostMem) wasFreed(p cuda.DevicePtr) bool {
	m.fmu.Lock()
	defer m.fmu.Unlock()
	return m.freed[uintptr(p)]
}

// under counts the slices whose memory was freed.
func (m *hostMem) under(views [][]byte) int {
	m.fmu.Lock()
	defer m.fmu.Unlock()
	n := 0
	for _, v := range views {
		if m.freed[uintptr(reflect.ValueOf(v).Pointer())] {
			n++
		}
	}
	return n
}

// dropWithView allocates a buffer, takes its Bytes (of the whole buffer,
// or through a view), and drops the buffer.
//
//go:noinline
func dropWithView(mr buffer.MemoryResource, viaSlice bool) []byte {
	b, err := buffer.Allocate(mr, 256, nil)
	if err != nil {
		panic(err)
	}
	src := b
	if viaSlice {
		if src, err = b.Slice(0, 128); err != nil {
			panic(err)
		}
	}
	p, err := src.Bytes()
	if err != nil {
		panic(err)
	}
	return p
}

// Issue 6, use after free: a []byte from Bytes does not keep its Buffer
// alive, and the safety net freed the memory under it (200 of 200). Now
// the net leaves viewed memory allocated, and counts it.
func TestLeaksNeverFreeUnderHostView(t *testing.T) {
	mr := newHostMem()
	leaks, kept := buffer.Leaks(), buffer.LeaksKept()
	const n = 200
	views := make([][]byte, n)
	for i := range views {
		views[i] = dropWithView(mr, i%2 == 1)
	}
	expectedLeaks.Add(n)
	collectUntil(t, "the dropped buffers were not collected", func() bool { return buffer.Leaks() >= leaks+n })
	assert.Zero(t, mr.under(views), "ranges freed under live host views")
	assert.Equal(t, kept+n, buffer.LeaksKept(), "each one counted")
	for _, v := range views {
		v[0]++ // still ours
	}
	runtime.KeepAlive(views)

	// Buffers without views are still freed by the net.
	p := dropOwned(mr, 64)
	expectedLeaks.Add(1)
	collectUntil(t, "the unviewed buffer was not freed", func() bool { return mr.wasFreed(p) })
	assert.Equal(t, kept+n, buffer.LeaksKept())
}

// The mark follows the memory through Disown into the next owner of the
// address (a virtual allocation growing in place does that).
func TestLeaksViewSurvivesDisown(t *testing.T) {
	mr := newHostMem()
	kept := buffer.LeaksKept()
	view := func() []byte {
		b, err := buffer.Allocate(mr, 64, nil)
		require.NoError(t, err)
		p, err := b.Bytes()
		require.NoError(t, err)
		ptr, size, err := b.Disown()
		require.NoError(t, err)
		_ = buffer.Owned(ptr, size, mr, nil) // the new owner, dropped
		return p
	}()
	expectedLeaks.Add(1)
	collectUntil(t, "the new owner was not collected", func() bool { return buffer.LeaksKept() == kept+1 })
	assert.Zero(t, mr.under([][]byte{view}))
	runtime.KeepAlive(view)
}

// callAll calls every exported method of *buffer.Buffer on b with zero
// arguments (and a zero stream where a stream is taken, when zeroStream)
// and returns, per method, the errors returned. A panic fails the test.
func callAll(t *testing.T, name string, mk func() *buffer.Buffer, zeroStream bool) map[string]error {
	t.Helper()
	errs := map[string]error{}
	typ := reflect.TypeFor[*buffer.Buffer]()
	streamT := reflect.TypeFor[*cuda.Stream]()
	errT := reflect.TypeFor[error]()
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		b := mk()
		args := []reflect.Value{reflect.ValueOf(b)}
		for j := 1; j < m.Type.NumIn(); j++ {
			in := m.Type.In(j)
			if zeroStream && in == streamT {
				args = append(args, reflect.ValueOf(&cuda.Stream{}))
				continue
			}
			if zeroStream && m.Type.IsVariadic() && j == m.Type.NumIn()-1 && in.Elem() == streamT {
				args = append(args, reflect.ValueOf([]*cuda.Stream{{}}))
				continue
			}
			args = append(args, reflect.Zero(in))
		}
		call := m.Func.Call
		if m.Type.IsVariadic() {
			call = m.Func.CallSlice // the last argument is the whole variadic slice
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: %s panicked: %v", name, m.Name, r)
				}
			}()
			for _, out := range call(args) {
				if out.Type() == errT && !out.IsNil() {
					errs[m.Name] = out.Interface().(error)
				}
				// A Hold taken is given back, as its users must: a buffer
				// held at Close leaves its free to the Release.
				if h, ok := out.Interface().(*buffer.Hold); ok && h != nil {
					_ = h.Release()
				}
			}
		}()
		if b != nil {
			_ = b.Close()
		}
	}
	return errs
}

// Issue 6, panics: every method on a nil or zero Buffer returns an error
// matching ErrInvalidArgument (or ErrClosed), or a zero value; so does
// every method of a closed buffer, and of open buffers given zero
// arguments (nil buffers, nil functions, zero streams).
func TestNilAndZeroValuesNeverPanic(t *testing.T) {
	// Fake addresses on a GPU machine must never reach the driver: every
	// open receiver here stops in Go (no device noDevice, a zero stream,
	// or a range no memory can have).
	mr, host := newFake(), newFake()
	host.hostAcc, host.devAcc = true, false
	receivers := map[string]func() *buffer.Buffer{
		"nil":                 func() *buffer.Buffer { return nil },
		"zero":                func() *buffer.Buffer { return &buffer.Buffer{} },
		"closed":              func() *buffer.Buffer { b := mr.alloc(64); _ = b.Close(); return b },
		"wrapping borrowed":   func() *buffer.Buffer { return buffer.FromPointer(math.MaxUint64-15, 32) },
		"null borrowed":       func() *buffer.Buffer { return buffer.FromPointer(0, 64) },
		"null owned":          func() *buffer.Buffer { return buffer.Owned(0, 64, host, nil) },
		"empty owned":         func() *buffer.Buffer { return buffer.Owned(0, 0, mr, nil) },
		"empty borrowed":      func() *buffer.Buffer { return buffer.FromPointer(0, 0) },
		"open device":         func() *buffer.Buffer { return mr.alloc(64) },
		"open device, stream": func() *buffer.Buffer { b, _ := buffer.Allocate(mr, 64, &cuda.Stream{}); return b },
		"open host":           func() *buffer.Buffer { return host.alloc(64) },
	}
	strict := map[string]bool{"nil": true, "zero": true, "closed": true, "wrapping borrowed": true, "null borrowed": true, "null owned": true}
	for name, mk := range receivers {
		for _, zs := range []bool{false, true} {
			errs := callAll(t, fmt.Sprintf("%s (zero stream %v)", name, zs), mk, zs)
			if !strict[name] {
				// Open buffers: only no panic. Zero arguments may go on
				// to find no driver, or no device noDevice.
				continue
			}
			for m, err := range errs {
				ok := errors.Is(err, cuda.ErrInvalidArgument) || errors.Is(err, cuda.ErrClosed)
				assert.True(t, ok, "%s.%s (zero stream %v): %v", name, m, zs, err)
			}
		}
	}

	// The zero Buffer in particular.
	var z buffer.Buffer
	assert.Zero(t, z.Size())
	assert.Zero(t, z.Ptr())
	assert.True(t, z.IsClosed())
	assert.False(t, z.IsOwned())
	assert.Nil(t, z.Resource())
	assert.Nil(t, z.Stream())
	assert.Equal(t, -1, z.DeviceID())
	assert.Equal(t, "Buffer(zero)", z.String())
	assert.NoError(t, z.Close())
	empty := mr.alloc(0)
	defer empty.Close()
	for what, err := range map[string]error{
		"Fill8":        z.Fill8(1, nil),
		"Slice":        func() error { _, err := z.Slice(0, 0); return err }(),
		"Bytes":        func() error { _, err := z.Bytes(); return err }(),
		"Disown":       func() error { _, _, err := z.Disown(); return err }(),
		"Use":          z.Use("op", func(cuda.DevicePtr) error { return nil }),
		"CopyTo":       empty.CopyTo(&z, nil),
		"CopyFrom":     z.CopyFrom(empty, nil),
		"CopyFromHost": buffer.CopyFromHost(&z, []byte{}, nil),
		"CopyToHost":   buffer.CopyToHost([]float32(nil), &z, nil),
		"ReadAt":       func() error { _, err := z.ReadAt(nil, 0); return err }(),
	} {
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, what)
		assert.Contains(t, err.Error(), "zero Buffer", what)
	}

	// Open buffers given nil functions and zero streams.
	b, c := mr.alloc(64), mr.alloc(64)
	defer b.Close()
	defer c.Close()
	assert.ErrorIs(t, b.Use("op", nil), cuda.ErrInvalidArgument)
	zs := &cuda.Stream{}
	for what, err := range map[string]error{
		"Fill32":       b.Fill32(1, zs),
		"CopyTo":       b.CopyTo(c, zs),
		"CopyFromHost": buffer.CopyFromHost(b, make([]byte, 64), zs),
		"CopyToHost":   buffer.CopyToHost(make([]byte, 64), b, zs),
		"Clone":        func() error { _, err := b.Clone(nil, zs); return err }(),
	} {
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, what)
		assert.Contains(t, err.Error(), "zero stream", what)
	}
}

// Issue 6: a host copy of 4 MiB or more on a zero cuda.Stream panicked in
// the staging pool (allocating through the stream's nil device) with the
// pool's lock held. Given as an argument or recorded at allocation, a
// zero stream is now an error, in every direction.
func TestZeroStreamLargeHostCopy(t *testing.T) {
	const n = buffer.StageMinBytes
	mr := newFake()
	b := mr.alloc(n)
	defer b.Close()
	zs := &cuda.Stream{}
	on, err := buffer.Allocate(mr, n, zs)
	require.NoError(t, err)
	defer on.Close()
	p := make([]byte, n)
	for what, err := range map[string]error{
		"CopyFromHost":        buffer.CopyFromHost(b, p, zs),
		"CopyToHost":          buffer.CopyToHost(p, b, zs),
		"CopyFromHost(alloc)": buffer.CopyFromHost(on, p, nil),
		"CopyToHost(alloc)":   buffer.CopyToHost(p, on, nil),
		"WriteAt(alloc)":      func() error { _, err := on.WriteAt(p, 0); return err }(),
		"ReadAt(alloc)":       func() error { _, err := on.ReadAt(p, 0); return err }(),
		"Fill8(alloc)":        on.Fill8(1, nil),
	} {
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, what)
		assert.Contains(t, err.Error(), "zero stream", what)
	}
}

// Issue 6, arithmetic: offsets and lengths near the limits of uint64 and
// int64, and ranges that wrap around the address space, are refused with
// errors naming the values, never wrapped into a valid-looking range.
func TestArithmeticOnHostileInput(t *testing.T) {
	mr := newHeap()
	b, err := buffer.Allocate(mr, 64, nil)
	require.NoError(t, err)
	defer b.Close()

	for _, c := range []struct{ off, n uint64 }{
		{math.MaxUint64, 1}, {1, math.MaxUint64}, {math.MaxUint64, math.MaxUint64},
		{65, 0}, {64, 1}, {1 << 63, 1 << 63},
	} {
		_, err := b.Slice(c.off, c.n)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "Slice(%d, %d)", c.off, c.n)
		assert.Contains(t, err.Error(), fmt.Sprintf("off=%d, n=%d", c.off, c.n))
	}
	for _, off := range []int64{math.MinInt64, -1} {
		_, err := b.ReadAt(make([]byte, 1), off)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), fmt.Sprint(off))
		_, err = b.WriteAt(make([]byte, 1), off)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), fmt.Sprint(off))
	}
	n, err := b.ReadAt(make([]byte, 8), math.MaxInt64)
	assert.Zero(t, n)
	assert.Equal(t, io.EOF, err)
	for _, off := range []int64{math.MaxInt64, math.MaxInt64 - 7, 60, 65} {
		n, err := b.WriteAt(make([]byte, 8), off)
		assert.Zero(t, n)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "WriteAt at %d", off)
		assert.Contains(t, err.Error(), fmt.Sprintf("at offset %d", off))
	}

	// Ranges past 2^64: every use is refused (and owned memory still
	// freed by Close).
	fake := newFake()
	fake.live[math.MaxUint64-15] = 32
	for name, w := range map[string]*buffer.Buffer{
		"borrowed": buffer.FromPointer(math.MaxUint64-15, 32),
		"owned":    buffer.Owned(math.MaxUint64-15, 32, fake, nil),
	} {
		for what, err := range map[string]error{
			"Slice":  func() error { _, err := w.Slice(16, 16); return err }(),
			"ReadAt": func() error { _, err := w.ReadAt(make([]byte, 1), 20); return err }(),
			"Bytes":  func() error { _, err := w.Bytes(); return err }(),
			"Fill8":  w.Fill8(0, nil),
			"Use":    w.Use("op", func(cuda.DevicePtr) error { return nil }),
		} {
			require.ErrorIs(t, err, cuda.ErrInvalidArgument, "%s %s", name, what)
			assert.Contains(t, err.Error(), "wraps around the address space", "%s %s", name, what)
		}
		require.NoError(t, w.Close())
	}
	assert.Zero(t, fake.liveCount(), "the owned one was freed")

	// Host memory whose range a Go slice cannot hold.
	host := newFake()
	host.hostAcc, host.devAcc, host.device = true, false, -1
	top := buffer.Owned(0x1000, 1<<63, host, nil) // no wrap, but longer than any Go slice
	host.live[0x1000] = 1 << 63
	_, err = top.Bytes()
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "does not fit in this process's address space")
	require.NoError(t, top.Close())
}

// A lost buffer whose resource refuses to free it is counted as kept: the
// cleanup cannot report the error to anyone, so it must not vanish.
func TestLeaksFreeFailureCounted(t *testing.T) {
	mr := newFake()
	mr.failFrees = 1
	leaks, kept := buffer.Leaks(), buffer.LeaksKept()
	dropOwned(mr, 64)
	expectedLeaks.Add(1)
	// The cleanup counts the leak before it tries the free, so wait for both.
	collectUntil(t, "the lost buffer was not collected and counted as kept", func() bool {
		return buffer.Leaks() == leaks+1 && buffer.LeaksKept() == kept+1
	})
	assert.Equal(t, 1, mr.liveCount(), "still allocated")
}
