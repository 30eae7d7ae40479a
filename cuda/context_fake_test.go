package cuda

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/loader"
)

// ctxFake is a private copy of the fake driver (its own library file, so
// its own state) with its device list, for the foreign-context tests.
type ctxFake struct {
	devs []*Device
	stat *fakecuda.Driver
}

// newCtxFake builds and opens a fresh fake driver reporting CUDA version
// (FAKECUDA_VERSION) with two devices.
func newCtxFake(t *testing.T, version string) *ctxFake {
	t.Helper()
	if _, err := loader.OpenLibrary("libc.so.6"); err != nil {
		t.Skipf("no dlopen here: %v", err)
	}
	path, err := fakecuda.Build(t.TempDir())
	if errors.Is(err, fakecuda.ErrNoCompiler) && !fakecuda.Required() {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Setenv("FAKECUDA_VERSION", version)
	t.Setenv("FAKECUDA_DEVICES", "2")
	drv, err := openDriver(path)
	require.NoError(t, err)
	ds, err := enumerate(drv)
	require.NoError(t, err)
	require.Len(t, ds, 2)
	st, err := fakecuda.Open(path)
	require.NoError(t, err)
	return &ctxFake{devs: ds, stat: st}
}

func (f *ctxFake) contexts() int64 { return f.stat.Stat(fakecuda.Contexts) }
func (f *ctxFake) streams() int64  { return f.stat.Stat(fakecuda.Streams) }

// threadCurrent runs f on a locked thread whose current context is set to
// start first, and returns the context current there afterwards.
func threadCurrent(t *testing.T, d *Device, start uintptr, f func()) uintptr {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	require.True(t, ok(d.drv.CtxSetCurrent.Call(start)))
	f()
	c, err := currentContext(d)
	require.NoError(t, err)
	return c
}

func TestNewContextOwnsAndPopsBothABIs(t *testing.T) {
	for _, version := range []string{"13000", "12040"} {
		t.Run(version, func(t *testing.T) {
			fk := newCtxFake(t, version)
			d := fk.devs[1]
			assert.Equal(t, version == "13000", d.drv.CtxCreateV4.Found(), "cuCtxCreate_v4 is asked for on CUDA 13 drivers only")
			prim, err := d.context()
			require.NoError(t, err)
			var c *Context
			// cuCtxCreate pushes: the thread's context is as before, both
			// with none and with the primary current.
			for _, start := range []uintptr{0, prim} {
				after := threadCurrent(t, d, start, func() {
					c, err = d.NewContext(ContextSchedBlockingSync)
					require.NoError(t, err)
				})
				assert.Equal(t, start, after, "NewContext left the thread's current context as it was")
				require.NoError(t, c.Close())
			}
			assert.Zero(t, fk.contexts())

			c, err = d.NewContext(0)
			require.NoError(t, err)
			assert.EqualValues(t, 1, fk.contexts())
			v := c.Device()
			assert.NotSame(t, d, v)
			assert.False(t, v.IsPrimary())
			assert.True(t, d.IsPrimary())
			assert.Same(t, d, v.Primary())
			assert.Same(t, d, d.Primary())
			assert.True(t, v.SameGPU(d) && d.SameGPU(v))
			assert.False(t, v.SameGPU(fk.devs[0]))
			assert.Equal(t, 1, v.Ordinal())
			assert.Contains(t, v.String(), "GPU 1 (context 0x")
			assert.Contains(t, c.String(), "GPU 1")
			h, err := v.Context()
			require.NoError(t, err)
			assert.Equal(t, c.Handle(), h)
			assert.NotEqual(t, prim, h)

			// A call through the view makes its context current.
			after := threadCurrent(t, d, prim, func() {
				_, _, err = v.MemInfo()
				require.NoError(t, err)
			})
			assert.Equal(t, h, after)
			// Features are the GPU's.
			fv, err := v.Features()
			require.NoError(t, err)
			fd, err := d.Features()
			require.NoError(t, err)
			assert.Equal(t, fd, fv)
			// A view of a view's GPU creates on the same GPU.
			c2, err := v.NewContext(0)
			require.NoError(t, err)
			assert.Same(t, d, c2.Device().Primary())
			require.NoError(t, c2.Close())

			// Streams, events and modules die with the context; their Close
			// then only marks them closed.
			s, err := v.NewStream()
			require.NoError(t, err)
			e, err := v.NewEvent(EventDisableTiming)
			require.NoError(t, err)
			require.NoError(t, e.Record(s))
			require.EqualValues(t, 1, fk.streams())
			require.NoError(t, c.Sync())
			require.NoError(t, c.Close())
			assert.Zero(t, fk.contexts())
			assert.Zero(t, fk.streams(), "the driver destroyed the context's stream")
			assert.True(t, c.IsClosed())
			assert.Zero(t, c.Handle())
			assert.Contains(t, c.String(), "closed")
			require.NoError(t, c.Close(), "idempotent")
			assert.NoError(t, e.Sync(), "an event of a destroyed context has nothing to wait for")
			done, err := e.Done()
			assert.True(t, done)
			assert.NoError(t, err)
			require.NoError(t, s.Close())
			require.NoError(t, e.Close())
			assert.ErrorIs(t, s.Sync(), ErrClosed)

			// Every call through the closed view says so.
			_, err = v.NewStream()
			assert.ErrorIs(t, err, ErrClosed)
			assert.Contains(t, err.Error(), "Device.NewStreamWith")
			assert.Contains(t, err.Error(), "destroyed")
			_, err = v.Context()
			assert.ErrorIs(t, err, ErrClosed)
			assert.ErrorIs(t, v.Sync(), ErrClosed)
			assert.ErrorIs(t, c.Sync(), ErrClosed)
			_, err = v.WrapStream(0)
			assert.ErrorIs(t, err, ErrClosed)
			_, err = v.LoadModule([]byte("x"))
			assert.ErrorIs(t, err, ErrClosed)
			assert.ErrorIs(t, v.DefaultStream().Sync(), ErrClosed)
			// The GPU's other views are unaffected.
			_, _, err = d.MemInfo()
			assert.NoError(t, err)
		})
	}
}

func TestNewContextRefusesBadInput(t *testing.T) {
	fk := newCtxFake(t, "13000")
	d := fk.devs[0]
	for _, flags := range []ContextFlags{0x100, 0xFFFF_FFFF, ContextSchedSpin | ContextSchedYield, ContextSchedYield | ContextSchedBlockingSync, 7} {
		_, err := d.NewContext(flags)
		assert.ErrorIs(t, err, ErrInvalidArgument, "flags %#x", uint32(flags))
		assert.Contains(t, err.Error(), "Device.NewContext")
	}
	for _, bad := range []*Device{nil, {}} {
		_, err := bad.NewContext(0)
		assert.ErrorIs(t, err, ErrInvalidArgument)
	}
	assert.Zero(t, fk.contexts())

	// A driver lacking the entry points: not supported, nothing created.
	_, err := fakeDevice().NewContext(0)
	assert.ErrorIs(t, err, ErrNotSupported)
}

func TestZeroContext(t *testing.T) {
	for _, c := range []*Context{nil, {}} {
		assert.Nil(t, c.Device())
		assert.Zero(t, c.Handle())
		assert.True(t, c.IsClosed())
		assert.NoError(t, c.Close())
		assert.ErrorIs(t, c.Sync(), ErrInvalidArgument)
		assert.Equal(t, "Context(nil)", c.String())
	}
	var d *Device
	assert.False(t, d.IsPrimary())
	assert.Nil(t, d.Primary())
	assert.False(t, d.SameGPU(d))
	assert.False(t, (&Device{}).SameGPU(fakeDevice()))
}

// The views of a context are found again: WrapContext of a NewContext
// handle is its view, of a primary context the primary view, and a
// context made with a raw cuCtxCreate gives one view that is never
// destroyed by cudamem.
func TestWrapContextIdentity(t *testing.T) {
	fk := newCtxFake(t, "13000")
	// WrapContext goes through the process's device table; point it at
	// this fake for the test.
	restore := useDevices(t, fk.devs)
	defer restore()
	d0, d1 := fk.devs[0], fk.devs[1]

	for _, d := range fk.devs {
		prim, err := d.context()
		require.NoError(t, err)
		v, err := WrapContext(prim)
		require.NoError(t, err)
		assert.Same(t, d, v, "a primary context is its GPU's primary view")
	}
	c, err := d1.NewContext(0)
	require.NoError(t, err)
	v, err := WrapContext(c.Handle())
	require.NoError(t, err)
	assert.Same(t, c.Device(), v)

	// A raw cuCtxCreate, as another library would make one.
	var raw uintptr
	after := threadCurrent(t, d0, 0, func() {
		require.True(t, ok(d0.drv.CtxCreateV4.Call(uintptr(unsafe.Pointer(&raw)), 0, 0, uintptr(d0.handle))))
		var popped uintptr
		require.True(t, ok(d0.drv.CtxPopCurrent.Call(uintptr(unsafe.Pointer(&popped)))))
		require.Equal(t, raw, popped)
	})
	require.Zero(t, after)
	w, err := WrapContext(raw)
	require.NoError(t, err)
	w2, err := WrapContext(raw)
	require.NoError(t, err)
	assert.Same(t, w, w2, "one view per context")
	assert.Same(t, d0, w.Primary())
	assert.False(t, w.IsPrimary())
	h, err := w.Context()
	require.NoError(t, err)
	assert.Equal(t, raw, h)
	s, err := w.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.Sync())
	require.NoError(t, s.Close())
	// The owner destroys it; the view never did.
	require.EqualValues(t, 2, fk.contexts())
	require.True(t, ok(d0.drv.CtxDestroy.Call(raw)))
	_, err = w.NewStream()
	assert.ErrorIs(t, err, ErrorInvalidContext, "a destroyed foreign context is the driver's error")
	_, err = WrapContext(raw)
	assert.ErrorIs(t, err, ErrorInvalidContext)
	assert.Contains(t, err.Error(), "WrapContext")

	require.NoError(t, c.Close())
	_, err = WrapContext(v.ctx)
	assert.ErrorIs(t, err, ErrorInvalidContext, "a closed context is not found again")
	assert.Zero(t, fk.contexts())

	_, err = WrapContext(0)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = WrapContext(0x1234)
	assert.ErrorIs(t, err, ErrorInvalidContext)
	assert.Contains(t, err.Error(), "0x1234")
}

// useDevices makes ds the process's device table for a test.
func useDevices(t *testing.T, ds []*Device) func() {
	t.Helper()
	old := devTable.list.Load()
	devTable.list.Store(&ds)
	return func() { devTable.list.Store(old) }
}

func TestWrapStreamChecksContext(t *testing.T) {
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	d0, d1 := fk.devs[0], fk.devs[1]
	c, err := d0.NewContext(0)
	require.NoError(t, err)
	defer c.Close()
	v := c.Device()

	sv, err := v.NewStream()
	require.NoError(t, err)
	defer sv.Close()
	s0, err := d0.NewStream()
	require.NoError(t, err)
	defer s0.Close()

	w, err := v.WrapStream(sv.Handle())
	require.NoError(t, err)
	assert.Same(t, v, w.Device())
	assert.True(t, w.IsBorrowed())
	require.NoError(t, w.Sync())
	require.NoError(t, w.Close())
	require.NoError(t, sv.Sync(), "closing the borrowed stream destroyed nothing")

	for _, tc := range []struct {
		dev *Device
		s   *Stream
	}{{d0, sv}, {d1, sv}, {v, s0}} {
		_, err := tc.dev.WrapStream(tc.s.Handle())
		require.ErrorIs(t, err, ErrInvalidArgument, "stream of %v wrapped on %v", tc.s.Device(), tc.dev)
		msg := err.Error()
		assert.Contains(t, msg, "Device.WrapStream")
		assert.Contains(t, msg, tc.dev.contextName())
		assert.True(t, strings.Contains(msg, tc.s.Device().contextName()), "%q names the stream's context", msg)
	}
	for _, h := range []uintptr{0, streamLegacy} {
		def, err := v.WrapStream(h)
		require.NoError(t, err)
		assert.Same(t, v.DefaultStream(), def)
		assert.NotSame(t, d0.DefaultStream(), def, "each view has its own legacy default stream")
	}
	_, err = v.WrapStream(streamPerThread)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = d0.WrapStream(0x999)
	assert.ErrorIs(t, err, ErrorInvalidHandle)
	assert.Contains(t, err.Error(), "0x999")

	// A stream whose context was destroyed is unknown to the driver.
	c2, err := d1.NewContext(0)
	require.NoError(t, err)
	s2, err := c2.Device().NewStream()
	require.NoError(t, err)
	h2 := s2.Handle()
	require.NoError(t, c2.Close())
	_, err = d1.WrapStream(h2)
	assert.ErrorIs(t, err, ErrorInvalidHandle)
	require.NoError(t, s2.Close())

	// A kernel of another view's module: refused naming both (the fake
	// loads no modules, so a Function is made by hand).
	f := &Function{mod: &Module{dev: d0, handle: 1}, name: "k", handle: 1}
	err = f.Launch(sv, Dim3{X: 1}, Dim3{X: 1}, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), v.contextName())
}

// Views and contexts used from many goroutines: no race, no leak.
func TestContextsConcurrent(t *testing.T) {
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := fk.devs[i%2]
			for range 20 {
				c, err := d.NewContext(0)
				if err != nil {
					errs <- err
					return
				}
				v, err := WrapContext(c.Handle())
				if err != nil || v != c.Device() {
					errs <- errors.Join(errors.New("WrapContext found another view"), err)
					return
				}
				s, err := v.NewStream()
				if err == nil {
					err = errors.Join(s.Sync(), s.Close())
				}
				if err = errors.Join(err, c.Close()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Zero(t, fk.contexts())
	assert.Zero(t, fk.streams())
}

// A handle the driver reused for a new context (another cuCtxGetId) is a
// new view: objects cached for the old one died with its context.
func TestWrapContextReusedHandle(t *testing.T) {
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	c, err := fk.devs[0].NewContext(0)
	require.NoError(t, err)
	defer c.Close()
	v := c.Device()
	require.NotZero(t, v.bind.id)
	w, err := WrapContext(c.Handle())
	require.NoError(t, err)
	require.Same(t, v, w)
	v.bind.id++ // as if the handle had named another context before
	w, err = WrapContext(c.Handle())
	require.NoError(t, err)
	assert.NotSame(t, v, w)
	assert.Equal(t, c.Handle(), w.ctx)
	w2, err := WrapContext(c.Handle())
	require.NoError(t, err)
	assert.Same(t, w, w2)
}
