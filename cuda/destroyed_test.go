package cuda

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/loader"
)

// assertRefused checks err is the refusal of a destroyed handle h: both
// ErrInvalidArgument and the driver's Result res, naming op and h.
func assertRefused(t *testing.T, err error, op string, h uintptr, res Result) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorIs(t, err, res)
	assert.Contains(t, err.Error(), op)
	assert.Contains(t, err.Error(), fmt.Sprintf("%#x", h))
	assert.Contains(t, err.Error(), "destroyed")
}

// noCrash checks that the fake saw no call a real driver may crash on.
func noCrash(t *testing.T, fk *ctxFake) {
	t.Helper()
	assert.Zero(t, fk.stat.Stat(fakecuda.Crashes), "a destroyed handle reached the driver")
}

// WrapContext of a context Context.Close destroyed is refused without a
// driver call (the real driver may crash on it); a context cudamem makes
// again at that address is live; one another library makes there is
// refused (nothing safe tells the two apart).
func TestWrapContextDestroyed(t *testing.T) {
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	fk.stat.SetContextReuse(true)
	d := fk.devs[0]

	c, err := d.NewContext(0)
	require.NoError(t, err)
	h := c.Handle()
	require.NoError(t, c.Close())
	_, err = WrapContext(h)
	assertRefused(t, err, "WrapContext", h, ErrorInvalidContext)
	assert.Contains(t, err.Error(), "Context.Close")
	noCrash(t, fk)

	// The driver gives the address to the next context.
	c2, err := d.NewContext(0)
	require.NoError(t, err)
	require.Equal(t, h, c2.Handle(), "the fake reuses the slot")
	v, err := WrapContext(h)
	require.NoError(t, err, "a context cudamem made at the address is live")
	assert.Same(t, c2.Device(), v)
	require.NoError(t, c2.Close())

	// Another library's context at the same address: refused too.
	var raw uintptr
	threadCurrent(t, d, 0, func() {
		require.True(t, ok(d.drv.CtxCreateV4.Call(uintptr(unsafe.Pointer(&raw)), 0, 0, uintptr(d.handle))))
		var popped uintptr
		require.True(t, ok(d.drv.CtxPopCurrent.Call(uintptr(unsafe.Pointer(&popped)))))
	})
	require.Equal(t, h, raw)
	_, err = WrapContext(raw)
	assertRefused(t, err, "WrapContext", raw, ErrorInvalidContext)
	require.True(t, ok(d.drv.CtxDestroy.Call(raw)))
	noCrash(t, fk)
	assert.Zero(t, fk.contexts())
}

// The same for green contexts: WrapGreenContext of a destroyed green
// context and WrapContext of its context are refused; a green context
// made elsewhere whose context takes the address of one cudamem destroyed
// is wrapped (the driver vouches for it).
func TestWrapGreenContextDestroyed(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) < 8 {
		t.Skip("green contexts need a 64-bit platform")
	}
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	fk.stat.SetContextReuse(true)
	d := fk.devs[1]

	c, err := d.NewGreenContext(8)
	require.NoError(t, err)
	g, h := c.Device().GreenContext(), c.Handle()
	require.NoError(t, c.Close())
	_, err = WrapGreenContext(g)
	assertRefused(t, err, "WrapGreenContext", g, ErrorInvalidHandle)
	_, err = WrapContext(h)
	assertRefused(t, err, "WrapContext", h, ErrorInvalidContext)
	noCrash(t, fk)

	c2, err := d.NewGreenContext(8)
	require.NoError(t, err)
	require.Equal(t, g, c2.Device().GreenContext(), "the fake reuses the slot")
	v, err := WrapGreenContext(g)
	require.NoError(t, err)
	assert.Same(t, c2.Device(), v)

	// A plain context destroyed by cudamem, then a green context made
	// elsewhere whose context gets that address (c2 stays open, so the
	// green context itself gets a fresh address).
	pc, err := d.NewContext(0)
	require.NoError(t, err)
	ph := pc.Handle()
	require.NoError(t, pc.Close())
	fg := rawGreenContext(t, d)
	w, err := WrapGreenContext(fg)
	require.NoError(t, err)
	wh, err := w.Context()
	require.NoError(t, err)
	assert.Equal(t, ph, wh, "the foreign green context's context took the destroyed address")
	require.True(t, ok(d.drv.GreenCtxDestroy.Call(fg)))
	require.NoError(t, c2.Close())
	noCrash(t, fk)
	assert.Zero(t, fk.contexts())
}

// rawGreenContext makes a green context of 8 SMs on d with the driver's
// calls, as another library would.
func rawGreenContext(t *testing.T, d *Device) uintptr {
	t.Helper()
	drv := d.drv
	var all, group devResource
	require.True(t, ok(drv.DeviceGetDevResource.Call(uintptr(d.handle), uintptr(unsafe.Pointer(&all)), devResourceTypeSM)))
	n := uint32(1)
	require.True(t, ok(drv.DevSmResourceSplitByCount.Call(uintptr(unsafe.Pointer(&group)), uintptr(unsafe.Pointer(&n)),
		uintptr(unsafe.Pointer(&all)), 0, 0, 8)))
	var desc, g uintptr
	require.True(t, ok(drv.DevResourceGenerateDesc.Call(uintptr(unsafe.Pointer(&desc)), uintptr(unsafe.Pointer(&group)), 1)))
	require.True(t, ok(drv.GreenCtxCreate.Call(uintptr(unsafe.Pointer(&g)), desc, uintptr(d.handle), greenCtxDefaultFlag)))
	return g
}

// WrapStream of a stream that died with a context cudamem destroyed
// (Context.Close) is refused without a driver call; one Stream.Close
// destroyed is not recorded (its address is the next stream's, whoever
// makes it) and reaches the driver. NewStreamWith and Stream.Close keep
// the record themselves.
func TestWrapStreamDestroyed(t *testing.T) {
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	d0, d1 := fk.devs[0], fk.devs[1]

	s, err := d0.NewStream()
	require.NoError(t, err)
	h := s.Handle()
	require.NoError(t, s.Close())
	_, err = d0.WrapStream(h)
	assert.ErrorIs(t, err, ErrorInvalidHandle, "the driver's answer: the fake has no stream there")
	assert.NotErrorIs(t, err, ErrInvalidArgument, "not refused from the record")

	c, err := d1.NewContext(0)
	require.NoError(t, err)
	cs, err := c.Device().NewStream()
	require.NoError(t, err)
	ch := cs.Handle()
	require.NoError(t, c.Close())
	_, err = d1.WrapStream(ch)
	assertRefused(t, err, "Device.WrapStream", ch, ErrorInvalidHandle)
	assert.Contains(t, err.Error(), "with its context")
	require.NoError(t, cs.Close())
	noCrash(t, fk)

	// A green context's streams are not destroyed with it (the driver
	// refuses calls on them): forgotten, not recorded.
	gc, err := d1.NewGreenContext(8)
	require.NoError(t, err)
	gs, err := gc.Device().NewStream()
	require.NoError(t, err)
	require.NoError(t, gc.Close())
	gone.mu.Lock()
	_, kept := gone.streams[gs.handle]
	_, dead := gone.m[handleKey{kindStream, gs.handle}]
	gone.mu.Unlock()
	assert.False(t, kept)
	assert.False(t, dead)
	noCrash(t, fk)
}

// A ForeignFunc bound to a view whose context Context.Close destroyed is
// refused with ErrClosed: the dead context never reaches cuCtxSetCurrent.
func TestForeignFuncClosedContext(t *testing.T) {
	fk := newCtxFake(t, "13000")
	libc, err := loader.OpenLibrary("libc.so.6")
	require.NoError(t, err)
	labs, err := libc.Lookup("labs")
	require.NoError(t, err)
	c, err := fk.devs[0].NewContext(0)
	require.NoError(t, err)
	f, err := c.Device().Foreign(labs)
	require.NoError(t, err)
	minus5 := -5
	r, err := f.Call(uintptr(minus5))
	require.NoError(t, err)
	assert.EqualValues(t, 5, r)
	require.NoError(t, c.Close())
	_, err = f.Call(uintptr(minus5))
	assert.ErrorIs(t, err, ErrClosed)
	assert.Contains(t, err.Error(), "labs")
	_, err = c.Device().Foreign(labs)
	assert.ErrorIs(t, err, ErrClosed)
	err = c.Device().Do(func() error { return nil })
	assert.ErrorIs(t, err, ErrClosed)
	noCrash(t, fk)
}

// Modules and kernels of a context Context.Close destroyed are refused
// before the driver, launched on any stream.
func TestModuleClosedContext(t *testing.T) {
	fk := newCtxFake(t, "13000")
	d := fk.devs[0]
	c, err := d.NewContext(0)
	require.NoError(t, err)
	v := c.Device()
	// The fake loads no modules: made by hand, as loaded in v.
	m := &Module{dev: v, handle: 1}
	f := &Function{mod: m, name: "k", handle: 1}
	require.NoError(t, c.Close())
	_, err = m.Function("k")
	assert.ErrorIs(t, err, ErrClosed)
	for _, s := range []*Stream{v.DefaultStream(), d.DefaultStream()} {
		assert.ErrorIs(t, f.Launch(s, Dim3{X: 1}, Dim3{X: 1}, 0), ErrClosed)
	}
	require.NoError(t, m.Close(), "unloaded with its context")
	noCrash(t, fk)
}

func noteDestroyed(k handleKind, h uintptr, by string) {
	gone.mu.Lock()
	defer gone.mu.Unlock()
	noteDestroyedLocked(k, h, by)
}

// The record stays bounded, and handles of one kind do not refuse
// another.
func TestDestroyedRecordBounded(t *testing.T) {
	gone.mu.Lock()
	saved := gone.m
	gone.m = nil
	gone.mu.Unlock()
	defer func() {
		gone.mu.Lock()
		gone.m = saved
		gone.mu.Unlock()
	}()
	for i := range goneMax + 10 {
		noteDestroyed(kindStream, uintptr(0x10000+i), "test")
	}
	gone.mu.Lock()
	n := len(gone.m)
	gone.mu.Unlock()
	assert.Equal(t, goneMax, n)
	noteDestroyed(kindContext, 0x42, "test")
	assert.Error(t, refuseDestroyed("op", kindContext, 0x42))
	assert.NoError(t, refuseDestroyed("op", kindGreen, 0x42))
	assert.NoError(t, refuseDestroyed("op", kindStream, 0x42))
	noteLive(kindContext, 0x42)
	assert.NoError(t, refuseDestroyed("op", kindContext, 0x42))
	noteDestroyed(kindContext, 0, "test")
	assert.NoError(t, refuseDestroyed("op", kindContext, 0))
	streamCreated(nil)
	streamClosed(&Stream{})
}
