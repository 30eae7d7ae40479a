package cuda

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/loader"
)

// fakeInteropDevice opens the loader's fake driver (its cuCtxSetCurrent
// fails for context 0xbad; cuCtxGetCurrent reports the last one set) as a
// device with primary context ctx.
func fakeInteropDevice(t *testing.T, ctx uintptr) *Device {
	t.Helper()
	if _, err := loader.OpenLibrary("libc.so.6"); err != nil {
		t.Skipf("no dlopen here: %v", err)
	}
	drv, err := openDriver(fakeDriverPath(t))
	require.NoError(t, err)
	d := &Device{drv: drv}
	d.setContext(ctx)
	d.defaultStream = Stream{dev: d}
	return d
}

func current(t *testing.T, d *Device) uintptr {
	t.Helper()
	c, err := currentContext(d)
	require.NoError(t, err)
	return c
}

func TestDeviceDoMakesCurrentAndRestores(t *testing.T) {
	d := fakeInteropDevice(t, 0x1234)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	require.True(t, ok(d.drv.CtxSetCurrent.Call(0x77)))

	var inside uintptr
	require.NoError(t, d.Do(func() error { inside = current(t, d); return nil }))
	assert.Equal(t, uintptr(0x1234), inside, "the device's context is current inside f")
	assert.Equal(t, uintptr(0x77), current(t, d), "the previous context is restored")

	myErr := errors.New("mine")
	assert.Same(t, myErr, d.Do(func() error { return myErr }), "f's error comes back as is")
	assert.Equal(t, uintptr(0x77), current(t, d))

	assert.Panics(t, func() { _ = d.Do(func() error { panic("boom") }) })
	assert.Equal(t, uintptr(0x77), current(t, d), "restored after a panic too")

	bad := fakeInteropDevice(t, 0xbad)
	ran := false
	err := bad.Do(func() error { ran = true; return nil })
	require.Error(t, err)
	assert.False(t, ran, "f does not run without its context")
	assert.ErrorIs(t, err, ErrorInvalidContext)
	assert.Contains(t, err.Error(), "Device.Do")
}

func TestDeviceDoConcurrent(t *testing.T) {
	a, b := fakeInteropDevice(t, 0x1000), fakeInteropDevice(t, 0x2000)
	var wg sync.WaitGroup
	for i := range 8 {
		d := a
		if i%2 == 1 {
			d = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				assert.NoError(t, d.Do(func() error { runtime.Gosched(); return nil }))
			}
		}()
	}
	wg.Wait()
}

func TestDeviceDoRefusesNilAndZero(t *testing.T) {
	var nilDev *Device
	assert.ErrorIs(t, nilDev.Do(func() error { return nil }), ErrInvalidArgument)
	assert.ErrorIs(t, (&Device{}).Do(func() error { return nil }), ErrInvalidArgument)
	assert.ErrorIs(t, fakeDevice().Do(nil), ErrInvalidArgument)
}

// foreignLib builds a small C library standing in for cuBLAS: a function
// returning its argument as a status, and a count of its calls.
func foreignLib(t *testing.T) *loader.Library {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if os.Getenv("CUDAMEM_REQUIRE_CC") != "" {
			t.Fatalf("no C compiler (%s): %v", cc, err)
		}
		t.Skipf("needs a C compiler (%s): %v", cc, err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "foreign.c")
	require.NoError(t, os.WriteFile(src, []byte(`
static int calls;
int foreign_calls(void) { return calls; }
long foreign_status(long x, long *out) { calls++; if (out) *out = x * 3; return x; }
`), 0o600))
	out := filepath.Join(dir, "libforeign.so")
	b, err := exec.Command(cc, "-shared", "-fPIC", "-o", out, src).CombinedOutput()
	require.NoError(t, err, "%s", b)
	l, err := loader.OpenLibrary(out)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

func TestForeignFuncCall(t *testing.T) {
	lib := foreignLib(t)
	status, err := lib.Lookup("foreign_status")
	require.NoError(t, err)
	calls, err := lib.Lookup("foreign_calls")
	require.NoError(t, err)
	d := fakeInteropDevice(t, 0x1234)

	f, err := d.Foreign(status)
	require.NoError(t, err)
	assert.Equal(t, "foreign_status", f.Name())
	assert.Same(t, d, f.Device())
	assert.Contains(t, f.String(), "foreign_status")

	var out int64
	r, err := f.Call(0, uintptr(unsafe.Pointer(&out)))
	require.NoError(t, err)
	assert.Equal(t, uintptr(0), r)
	r, err = f.Call(7, uintptr(unsafe.Pointer(&out)))
	require.NoError(t, err, "a non-zero status of the function itself is not a call failure")
	assert.Equal(t, uintptr(7), r)
	assert.Equal(t, int64(21), out, "the function wrote through the stack pointer")
	assert.Equal(t, uintptr(2), calls.Call())

	// A device whose context cannot be made current: not called.
	bad := fakeInteropDevice(t, 0xbad)
	fb, err := bad.Foreign(status)
	require.NoError(t, err)
	_, err = fb.Call(7, 0)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrorInvalidContext)
	assert.Contains(t, err.Error(), "foreign_status")
	assert.Contains(t, err.Error(), "not called")
	assert.Equal(t, uintptr(2), calls.Call(), "the function was not called")

	_, err = f.Call(make([]uintptr, loader.MaxArgs+1)...)
	assert.ErrorIs(t, err, ErrInvalidArgument)

	_, err = d.Foreign(loader.Proc{})
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = (*Device)(nil).Foreign(status)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	var nf *ForeignFunc
	_, err = nf.Call()
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = (&ForeignFunc{}).Call(1)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Equal(t, "ForeignFunc(nil)", nf.String())
	assert.Nil(t, nf.Device())
	assert.Equal(t, "", nf.Name())
}

func TestClosedHandlesAreNotHandedOut(t *testing.T) {
	d := fakeDevice()
	s := &Stream{dev: d, handle: 0x55, owned: true}
	h, err := s.HandleErr()
	require.NoError(t, err)
	assert.Equal(t, uintptr(0x55), h)
	assert.Equal(t, uintptr(0x55), s.Handle())
	s.guard.Close()
	assert.Zero(t, s.Handle(), "a destroyed stream's handle is not handed out")
	_, err = s.HandleErr()
	assert.ErrorIs(t, err, ErrClosed)
	assert.True(t, s.IsClosed())

	h, err = d.DefaultStream().HandleErr()
	assert.NoError(t, err, "the legacy default stream is handle 0, and no error")
	assert.Zero(t, h)
	_, err = (*Stream)(nil).HandleErr()
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = (&Stream{}).HandleErr()
	assert.ErrorIs(t, err, ErrInvalidArgument)

	e := &Event{dev: d, handle: 0x66}
	h, err = e.HandleErr()
	require.NoError(t, err)
	assert.Equal(t, uintptr(0x66), h)
	e.guard.Close()
	assert.Zero(t, e.Handle())
	_, err = e.HandleErr()
	assert.ErrorIs(t, err, ErrClosed)
	assert.True(t, e.IsClosed())
	_, err = (*Event)(nil).HandleErr()
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

func TestWrapStream(t *testing.T) {
	d := fakeDevice()
	s, err := d.WrapStream(0x99)
	require.NoError(t, err)
	assert.True(t, s.IsBorrowed())
	assert.False(t, s.IsDefault())
	assert.Equal(t, uintptr(0x99), s.Handle())
	assert.Same(t, d, s.Device())
	require.NoError(t, s.Close(), "Close of a borrowed stream destroys nothing (the fake has no cuStreamDestroy)")
	assert.True(t, s.IsClosed())
	assert.ErrorIs(t, s.Sync(), ErrClosed)
	assert.Zero(t, s.Handle())
	require.NoError(t, s.Close())

	def, err := d.WrapStream(0)
	require.NoError(t, err)
	assert.Same(t, d.DefaultStream(), def)
	_, err = (*Device)(nil).WrapStream(1)
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

var interopPad [64]byte

// deepForeign recurses n frames deep, then has the foreign function write
// into a stack variable: the write must land wherever the call is made
// from (run with -race too, whose instrumentation could move the stack).
//
//go:noinline
func deepForeign(t *testing.T, f *ForeignFunc, n int) {
	var pad [128]byte
	interopPad[0] = pad[n%128]
	if n > 0 {
		deepForeign(t, f, n-1)
		return
	}
	var out int64
	if _, err := f.Call(5, uintptr(unsafe.Pointer(&out))); err != nil || out != 15 {
		t.Errorf("write through a stack pointer lost: %d, %v", out, err)
	}
}

func TestForeignFuncSurvivesStackGrowth(t *testing.T) {
	lib := foreignLib(t)
	status, err := lib.Lookup("foreign_status")
	require.NoError(t, err)
	f, err := fakeInteropDevice(t, 0x1234).Foreign(status)
	require.NoError(t, err)
	for depth := 0; depth < 300; depth++ {
		done := make(chan struct{})
		go func() { defer close(done); deepForeign(t, f, depth) }()
		<-done
	}
}
