package cuda_test

// GPU tests of foreign streams and contexts (skip without a GPU; fail with
// CUDAMEM_REQUIRE_GPU=1): TestGPUWrapRawStream, TestGPUNewContextResources,
// TestGPUWrapRawContext.

import (
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// ctxRoundTrip allocates from mr on s, copies a host slice into the first
// half, fills the second half with 7, adds 5 to every word with a kernel,
// reads the buffer back and compares.
func ctxRoundTrip(t *testing.T, name string, mr buffer.MemoryResource, s *cuda.Stream, k *cudatest.Kernels) {
	t.Helper()
	const words = 1 << 18 // 1 MiB: large enough for the staged host copies
	src := make([]uint32, words/2)
	for i := range src {
		src[i] = uint32(i) * 2654435761
	}
	b, err := buffer.Allocate(mr, words*4, s)
	require.NoError(t, err, "%s: Allocate", name)
	head, err := b.Slice(0, words*2)
	require.NoError(t, err)
	tail, err := b.Slice(words*2, words*2)
	require.NoError(t, err)
	require.NoError(t, buffer.CopyFromHost(head, src, s), "%s: CopyFromHost", name)
	require.NoError(t, tail.Fill32(7, s), "%s: Fill32", name)
	require.NoError(t, k.Add(s, b.Ptr(), words, 5), "%s: kernel", name)
	got := make([]uint32, words)
	require.NoError(t, buffer.CopyToHost(got, b, s), "%s: CopyToHost", name)
	bad := 0
	for i, g := range got {
		want := uint32(12)
		if i < len(src) {
			want = src[i] + 5
		}
		if g != want {
			if bad < 5 {
				t.Errorf("%s: word %d = %#x, want %#x", name, i, g, want)
			}
			bad++
		}
	}
	assert.Zero(t, bad, "%s: words that differ", name)
	require.NoError(t, head.Close())
	require.NoError(t, tail.Close())
	require.NoError(t, b.Close(), "%s: Close", name)
	require.NoError(t, s.Sync())
}

// rawStream creates a non-blocking stream with cuStreamCreate, called
// through the driver library directly (as another library would) with d's
// context current, and returns it with a function that destroys it.
func rawStream(t *testing.T, d *cuda.Device) (uintptr, func()) {
	t.Helper()
	create := driverProc(t, "cuStreamCreate")
	destroy := driverProc(t, "cuStreamDestroy_v2")
	var h uintptr
	require.NoError(t, d.Do(func() error {
		if r := create.Call(uintptr(unsafe.Pointer(&h)), 1); int32(r) != 0 {
			return fmt.Errorf("cuStreamCreate: CUresult %d", int32(r))
		}
		return nil
	}))
	require.NotZero(t, h)
	return h, func() {
		require.NoError(t, d.Do(func() error {
			if r := destroy.Call(h); int32(r) != 0 {
				return fmt.Errorf("cuStreamDestroy: CUresult %d", int32(r))
			}
			return nil
		}))
	}
}

// GPU: a stream made with a raw cuStreamCreate in the primary context,
// wrapped, carries a pool allocation, a host copy, a fill and a kernel;
// the data read back matches, and closing the wrapper destroys nothing.
func TestGPUWrapRawStream(t *testing.T) {
	d := cudatest.Device(t)
	h, destroy := rawStream(t, d)
	defer destroy()
	s, err := d.WrapStream(h)
	require.NoError(t, err)
	assert.True(t, s.IsBorrowed())
	pool, err := resource.CurrentDevicePool(d)
	require.NoError(t, err)
	defer pool.Close()
	k := cudatest.LoadKernels(t, d)
	ctxRoundTrip(t, "current pool on a raw stream", pool, s, k)
	require.NoError(t, s.Close())
	// Still alive: a second wrapper of the same handle works.
	s2, err := d.WrapStream(h)
	require.NoError(t, err)
	require.NoError(t, s2.Sync())
	require.NoError(t, s2.Close())
}

// GPU: a context made with Device.NewContext. Its view carries an owned
// device pool, a synchronous resource, the current pool and kernels on
// its own and on raw streams; streams of other contexts are refused by
// WrapStream; the thread's current context is untouched by NewContext;
// after Close every use is ErrClosed.
func TestGPUNewContextResources(t *testing.T) {
	d := cudatest.Device(t)
	set, get := driverProc(t, "cuCtxSetCurrent"), driverProc(t, "cuCtxGetCurrent")
	var c *cuda.Context
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.Zero(t, set.Call(0))
		var err error
		c, err = d.NewContext(0)
		require.NoError(t, err)
		var cur uintptr = 1
		require.Zero(t, get.Call(uintptr(unsafe.Pointer(&cur))))
		assert.Zero(t, cur, "NewContext left no context pushed on the thread")
	}()
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	v := c.Device()
	require.False(t, v.IsPrimary())
	require.Same(t, d, v.Primary())
	h, err := v.Context()
	require.NoError(t, err)
	prim, err := d.Context()
	require.NoError(t, err)
	require.NotEqual(t, prim, h)

	k := cudatest.LoadKernels(t, v)
	s, err := v.NewStream()
	require.NoError(t, err)
	owned, err := resource.NewDevicePool(v, nil)
	require.NoError(t, err)
	syncRes, err := resource.NewSyncDevice(v)
	require.NoError(t, err)
	current, err := resource.CurrentDevicePool(v)
	require.NoError(t, err)
	ctxRoundTrip(t, "owned pool in a new context", owned, s, k)
	ctxRoundTrip(t, "cuMemAlloc in a new context", syncRes, s, k)
	ctxRoundTrip(t, "current pool in a new context", current, s, k)
	vm, err := virtual.New(v, nil)
	require.NoError(t, err)
	ctxRoundTrip(t, "virtual memory in a new context", vm, s, k)

	// Pools belong to the GPU: the primary view's pool serves the view's
	// stream.
	primPool, err := resource.CurrentDevicePool(d)
	require.NoError(t, err)
	ctxRoundTrip(t, "primary view's pool on the new context's stream", primPool, s, k)

	// A raw stream of the new context, wrapped by its view.
	rh, destroy := rawStream(t, v)
	w, err := v.WrapStream(rh)
	require.NoError(t, err)
	ctxRoundTrip(t, "owned pool on a raw stream of the new context", owned, w, k)
	require.NoError(t, w.Close())
	// Refused by a view of another context, naming both.
	_, err = d.WrapStream(rh)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	// v.String() is "GPU n (context 0x…)": the message names that handle.
	vctx := regexp.MustCompile(`context 0x[0-9a-f]+`).FindString(v.String())
	require.NotEmpty(t, vctx, v.String())
	assert.Contains(t, err.Error(), "belongs to "+vctx)
	ps := cudatest.Stream(t, d)
	_, err = v.WrapStream(ps.Handle())
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	destroy()
	// A kernel of the new context's module on a primary stream: refused.
	err = k.Add(ps, 0, 0, 0)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)

	// Same view found again by handle.
	again, err := cuda.WrapContext(h)
	require.NoError(t, err)
	assert.Same(t, v, again)

	require.NoError(t, owned.Close())
	require.NoError(t, s.Close())
	require.NoError(t, c.Close())
	closed = true
	assert.True(t, c.IsClosed())
	require.NoError(t, c.Close())
	_, err = v.NewStream()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = syncRes.Allocate(64, nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	// The primary context is unaffected.
	ctxRoundTrip(t, "primary after the new context closed", primPool, d.DefaultStream(), cudatest.LoadKernels(t, d))
}

// GPU: a context made with a raw cuCtxCreate through the driver library
// (as a framework would), adopted with WrapContext, carries resources,
// copies, fills and kernels; only its owner (the test) destroys it.
func TestGPUWrapRawContext(t *testing.T) {
	d := cudatest.Device(t)
	create := driverProc(t, "cuCtxCreate_v4")
	pop := driverProc(t, "cuCtxPopCurrent_v2")
	destroyCtx := driverProc(t, "cuCtxDestroy_v2")
	deviceGet := driverProc(t, "cuDeviceGet")
	raw := func() (h uintptr) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var cu int32
		require.Zero(t, deviceGet.Call(uintptr(unsafe.Pointer(&cu)), uintptr(d.Ordinal())))
		require.Zero(t, create.Call(uintptr(unsafe.Pointer(&h)), 0, 0, uintptr(cu)), "cuCtxCreate_v4")
		var popped uintptr
		require.Zero(t, pop.Call(uintptr(unsafe.Pointer(&popped))))
		require.Equal(t, h, popped)
		return h
	}
	h := raw()
	defer func() { assert.Zero(t, destroyCtx.Call(h), "cuCtxDestroy by its owner") }()

	v, err := cuda.WrapContext(h)
	if err != nil && strings.Contains(err.Error(), "was destroyed") {
		// The driver gave this new context the address of one an earlier
		// test closed through cudamem, which WrapContext cannot tell
		// from that dead context (documented): while this one lives, a
		// second one gets another address.
		t.Logf("address %#x reused from a context cudamem destroyed: %v", h, err)
		h2 := raw()
		defer func() { assert.Zero(t, destroyCtx.Call(h2), "cuCtxDestroy by its owner") }()
		h, h2 = h2, h
		v, err = cuda.WrapContext(h)
	}
	require.NoError(t, err)
	v2, err := cuda.WrapContext(h)
	require.NoError(t, err)
	assert.Same(t, v, v2)
	assert.Same(t, d, v.Primary())
	assert.Equal(t, d.Ordinal(), v.Ordinal())
	got, err := v.Context()
	require.NoError(t, err)
	assert.Equal(t, h, got)

	k := cudatest.LoadKernels(t, v)
	s, err := v.NewStream()
	require.NoError(t, err)
	owned, err := resource.NewDevicePool(v, nil)
	require.NoError(t, err)
	syncRes, err := resource.NewSyncDevice(v)
	require.NoError(t, err)
	ctxRoundTrip(t, "owned pool in a wrapped context", owned, s, k)
	ctxRoundTrip(t, "cuMemAlloc in a wrapped context", syncRes, s, k)
	rh, destroy := rawStream(t, v)
	w, err := v.WrapStream(rh)
	require.NoError(t, err)
	ctxRoundTrip(t, "owned pool on a raw stream of a wrapped context", owned, w, k)
	require.NoError(t, w.Close())
	destroy()
	require.NoError(t, owned.Close())
	require.NoError(t, s.Close())
	require.NoError(t, v.Sync())
}

// GPU: a green context of at least 16 SMs made with NewGreenContext: its
// view carries an owned pool, cuMemAlloc memory, host copies, fills and
// kernels on its own (cuGreenCtxStreamCreate) stream, which WrapStream
// recognizes; the primary view refuses it. Skips where green contexts are
// not supported.
func TestGPUGreenContext(t *testing.T) {
	d := cudatest.Device(t)
	c, err := d.NewGreenContext(16)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	t.Logf("green context %v with %d SMs", c, c.SMCount())
	assert.GreaterOrEqual(t, c.SMCount(), 16)
	v := c.Device()
	require.NotZero(t, v.GreenContext())
	same, err := cuda.WrapGreenContext(v.GreenContext())
	require.NoError(t, err)
	assert.Same(t, v, same)

	k := cudatest.LoadKernels(t, v)
	s, err := v.NewStream()
	require.NoError(t, err)
	w, err := v.WrapStream(s.Handle())
	require.NoError(t, err, "the green context's own stream")
	require.NoError(t, w.Close())
	_, err = d.WrapStream(s.Handle())
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)

	owned, err := resource.NewDevicePool(v, nil)
	require.NoError(t, err)
	syncRes, err := resource.NewSyncDevice(v)
	require.NoError(t, err)
	ctxRoundTrip(t, "owned pool in a green context", owned, s, k)
	ctxRoundTrip(t, "cuMemAlloc in a green context", syncRes, s, k)

	require.NoError(t, owned.Close())
	require.NoError(t, s.Close(), "streams before the green context")
	require.NoError(t, c.Close())
	closed = true
	_, err = v.NewStream()
	assert.ErrorIs(t, err, cuda.ErrClosed)
}
