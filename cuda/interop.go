package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// Do runs f on a locked OS thread with d's primary context current, then
// restores the context that was current on that thread before and
// unlocks the thread (also when f panics). It is safe for concurrent use:
// each call has its own thread. f's error is returned as is; failing to
// make the context current (f is then not run) or to restore the previous
// one is an *OpError naming "Device.Do".
//
// Inside f, foreign code sees d's primary context until a cudamem call on
// another device makes that device's current (keep foreign calls for d
// before such calls, or nest another Do). f must not unlock the OS thread.
func (d *Device) Do(f func() error) (err error) {
	const op = "Device.Do"
	if f == nil {
		return Errorf(op, ErrInvalidArgument, "nil function")
	}
	ctx, err := d.contextFor(op)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	if r := d.drv.CtxGetCurrent.Call(uintptr(unsafe.Pointer(&prev))); !ok(r) {
		return &OpError{Op: op, Err: fmt.Errorf("reading the thread's current context: %w", fail(&d.drv.CtxGetCurrent, r))}
	}
	if r := d.drv.CtxSetCurrent.Call(ctx); !ok(r) {
		return &OpError{Op: op, Err: fmt.Errorf("making %s current: %w", d.contextName(), fail(&d.drv.CtxSetCurrent, r))}
	}
	defer func() {
		if r := d.drv.CtxSetCurrent.Call(prev); !ok(r) {
			err = errors.Join(err, &OpError{Op: op, Err: fmt.Errorf("restoring the thread's previous context %#x: %w", prev, fail(&d.drv.CtxSetCurrent, r))})
		}
	}()
	return f()
}

// ForeignFunc is a C function of another library bound to a device: Call
// runs it with the device's context current on the calling OS thread,
// inside the same crossing into C, so callers need neither
// runtime.LockOSThread nor cuCtxSetCurrent. Make one with Device.Foreign;
// it is safe for concurrent use. The zero ForeignFunc refuses every call.
type ForeignFunc struct {
	dev *Device
	ctx uintptr
	p   loader.Proc // bound to the device's driver (loader.Driver.Bind)
}

// Foreign binds p, a function found in another library with
// loader.Library.Lookup, to d (see ForeignFunc). An unresolved p is an
// error matching ErrInvalidArgument; a driver without cuCtxSetCurrent one
// matching ErrNotSupported; a view whose context Context.Close destroyed
// one matching ErrClosed. p itself is not checked: cudamem cannot tell a
// C function from any other address, and calls whatever p points at.
func (d *Device) Foreign(p loader.Proc) (*ForeignFunc, error) {
	const op = "Device.Foreign"
	if !p.Found() {
		return nil, Errorf(op, ErrInvalidArgument, "unresolved function %q (look it up with loader.Library.Lookup first)", p.Name())
	}
	ctx, err := d.contextFor(op)
	if err != nil {
		return nil, err
	}
	b := d.drv.Bind(p)
	if !b.Bound() {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: the installed driver does not provide cuCtxSetCurrent", ErrNotSupported)}
	}
	return &ForeignFunc{dev: d, ctx: ctx, p: b}, nil
}

// Name is the function's symbol name ("" for a nil or zero ForeignFunc).
func (f *ForeignFunc) Name() string {
	if f == nil {
		return ""
	}
	return f.p.Name()
}

// Device is the device whose primary context the calls use (nil for a nil
// or zero ForeignFunc).
func (f *ForeignFunc) Device() *Device {
	if f == nil {
		return nil
	}
	return f.dev
}

// Call calls the function with integer and pointer arguments (at most
// loader.MaxArgs; no floating-point values by value) and returns its
// result register for the caller to interpret; for a C int or enum result
// read int32(r) (or uint32), since the register's upper half is undefined.
//
// err is non-nil only when the function was not called: a nil or zero
// ForeignFunc, too many arguments, a view whose context Context.Close
// destroyed (an error matching ErrClosed, before the driver sees it), or
// the context could not be made current (an *OpError naming the function,
// wrapping the cuCtxSetCurrent Result; on a non-zero result Call asks the
// driver again whether the context can be made current, and only if not
// is the result taken for cuCtxSetCurrent's). A context destroyed
// elsewhere cannot be seen and reaches the driver.
//
// As with loader.Proc.Call, write uintptr(unsafe.Pointer(&x)) conversions
// in the argument list itself (Call is nosplit and norace, so the stack
// cannot move before the C call), and keep heap objects alive with
// runtime.KeepAlive.
//
//go:nosplit
//go:norace
func (f *ForeignFunc) Call(args ...uintptr) (uintptr, error) {
	if f == nil || f.dev == nil {
		return loader.NotFound, foreignInvalid()
	}
	if len(args) > loader.MaxArgs {
		return loader.NotFound, f.tooMany(len(args))
	}
	if b := f.dev.bind; b != nil && b.closed.Load() {
		return loader.NotFound, f.closedErr()
	}
	r := f.p.CallCtx(f.ctx, args...)
	// A failed cuCtxSetCurrent leaves a CUresult, 32 bits: a zero low half
	// is never one, whatever the upper half holds (undefined in the C ABI
	// for the int and enum results most libraries return).
	if uint32(r) == 0 {
		return r, nil
	}
	return r, f.classify(r)
}

func foreignInvalid() error {
	return Errorf("ForeignFunc.Call", ErrInvalidArgument, "nil or zero ForeignFunc (use Device.Foreign)")
}

func (f *ForeignFunc) closedErr() error { return f.dev.contextClosed(f.p.Name()) }

func (f *ForeignFunc) tooMany(n int) error {
	return Errorf(f.p.Name(), ErrInvalidArgument, "%d arguments, at most %d can be passed", n, loader.MaxArgs)
}

// classify decides whether a non-zero result r came from cuCtxSetCurrent
// (the function was not called): only if the context cannot be made
// current now either.
func (f *ForeignFunc) classify(r uintptr) error {
	set := &f.dev.drv.CtxSetCurrent
	if again := set.Call(f.ctx); ok(again) {
		return nil // the context can be set: r is the function's own
	}
	return &OpError{Op: f.p.Name(), Err: fmt.Errorf("not called: making %s current failed: %w", f.dev.contextName(), fail(set, uintptr(uint32(r))))}
}

// String names the function and its device.
func (f *ForeignFunc) String() string {
	if f == nil || f.dev == nil {
		return "ForeignFunc(nil)"
	}
	return fmt.Sprintf("ForeignFunc(%s on %v)", f.p.Name(), f.dev)
}

// Special stream handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD).
const (
	streamLegacy    = 0x1
	streamPerThread = 0x2
)

// WrapStream returns a borrowed Stream for h, a CUstream of d's context
// that another library created: cudamem can order its work on it, and
// Close only ends its use here. The stream must outlive every use of the
// returned Stream. Handle 0 (and CU_STREAM_LEGACY) gives d's legacy
// default stream; CU_STREAM_PER_THREAD is refused, since goroutines are
// not threads.
//
// A stream of another context than d's (a green context's included) is an
// error matching ErrInvalidArgument naming both contexts (skipped on a
// driver without cuStreamGetCtx). A stream that died with a context
// cudamem destroyed is refused before any driver call, with an error
// matching both ErrInvalidArgument and CUDA_ERROR_INVALID_HANDLE. Any
// other dead or bogus handle goes to the driver, which may refuse it or
// crash the process.
func (d *Device) WrapStream(h uintptr) (*Stream, error) {
	const op = "Device.WrapStream"
	if err := d.check(op); err != nil {
		return nil, err
	}
	if err := d.contextClosed(op); err != nil {
		return nil, err
	}
	switch h {
	case 0, streamLegacy:
		return d.DefaultStream(), nil
	case streamPerThread:
		return nil, Errorf(op, ErrInvalidArgument, "CU_STREAM_PER_THREAD (%#x) names a different stream on every OS thread, and goroutines move between threads: wrap a created stream", h)
	}
	if err := refuseDestroyed(op, kindStream, h); err != nil {
		return nil, err
	}
	if err := d.streamInContext(op, h); err != nil {
		return nil, err
	}
	// Blocking, so the legacy stream is refused while it captures (a
	// driver without cuStreamGetFlags leaves it non-blocking).

	var flags uint32
	blocking := false
	if ctx, err := d.contextFor(op); err == nil && d.drv.StreamGetFlags.Found() {
		if r := d.drv.StreamGetFlags.CallCtx(ctx, h, uintptr(unsafe.Pointer(&flags))); !ok(r) {
			return nil, &OpError{Op: op, Err: fmt.Errorf("stream %#x: %w", h, fail(&d.drv.StreamGetFlags, r))}
		}
		blocking = StreamFlags(flags)&StreamNonBlocking == 0
	}
	s := &Stream{dev: d, handle: h, borrowed: true}
	s.capture.blocking = blocking
	return s, nil
}

// streamInContext checks that stream h belongs to d's context.
func (d *Device) streamInContext(op string, h uintptr) error {
	drv := d.drv
	if !drv.StreamGetCtxV2.Found() && !drv.StreamGetCtx.Found() {
		return nil // nothing to ask (a driver older than CUDA 9.2)
	}
	ctx, err := d.contextFor(op)
	if err != nil {
		return err
	}
	var c, green uintptr
	p := &drv.StreamGetCtxV2
	var r uintptr
	if p.Found() {
		r = p.CallCtx(ctx, h, uintptr(unsafe.Pointer(&c)), uintptr(unsafe.Pointer(&green)))
	} else {
		p = &drv.StreamGetCtx
		r = p.CallCtx(ctx, h, uintptr(unsafe.Pointer(&c)))
	}
	if !ok(r) {
		return &OpError{Op: op, Err: fmt.Errorf("stream %#x: %w", h, fail(p, r))}
	}
	mine := d.green()
	switch {
	case mine != 0 && green == mine:
		return nil // a green context's stream reports the primary context in c
	case green != 0:
		return Errorf(op, ErrInvalidArgument, "stream %#x belongs to green context %#x, not to %s", h, green, d.contextName())
	case mine != 0:
		return Errorf(op, ErrInvalidArgument, "stream %#x belongs to %s, not to %s", h, describeContext(c), d.contextName())
	case c != ctx:
		return Errorf(op, ErrInvalidArgument, "stream %#x belongs to %s, not to %s: wrap it with that context's Device (cuda.WrapContext)", h, describeContext(c), d.contextName())
	}
	return nil
}

// describeContext names context c for messages: its handle, and which
// view of which GPU it is when cudamem has one (see Device.contextName).
func describeContext(c uintptr) string {
	if ds := devTable.list.Load(); ds != nil {
		for _, d := range *ds {
			if d.ctxOK.Load() && d.ctx == c {
				return d.contextName()
			}
		}
	}
	views.mu.Lock()
	v := views.m[c]
	views.mu.Unlock()
	if v != nil {
		return v.contextName()
	}
	return fmt.Sprintf("context %#x", c)
}

// contextName names d's context for messages, each handle once: "context
// 0x... (GPU 0's primary context)", "context 0x... (GPU 0, not its primary
// context)", "context 0x... (green context 0x... of GPU 0)". (d's String
// names the GPU and, for a view, the context: "GPU 0 (context 0x...)".)
func (d *Device) contextName() string {
	switch {
	case !d.valid():
		return "no context (a nil or zero Device)"
	case d.bind != nil && d.green() != 0:
		return fmt.Sprintf("context %#x (green context %#x of GPU %d)", d.ctx, d.green(), d.ordinal)
	case d.bind != nil:
		return fmt.Sprintf("context %#x (GPU %d, not its primary context)", d.ctx, d.ordinal)
	case !d.ctxOK.Load():
		return fmt.Sprintf("GPU %d's primary context (not retained yet)", d.ordinal)
	}
	return fmt.Sprintf("context %#x (GPU %d's primary context)", d.ctx, d.ordinal)
}
