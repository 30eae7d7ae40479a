package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// binding ties a Device view to a context other than its GPU's primary one.
type binding struct {
	primary *Device // the GPU's primary view (GetDevice)
	owned   bool    // made by NewContext: destroyed by Context.Close
	id      uint64  // cuCtxGetId, 0 if the driver cannot say
	closed  atomic.Bool

	// green is the CUgreenCtx this context was converted from (0 if not
	// green); sms its SM count when NewGreenContext made it. Written
	// before the view is shared, or (WrapGreenContext) under views.mu.
	green uintptr
	sms   int
}

// contextID asks the driver for context h's unique ID (cuCtxGetId, CUDA
// 12.0+): handles are addresses the driver may reuse after a context is
// destroyed, IDs are never reused. 0 when the driver cannot say.
func contextID(p *Device, h uintptr) uint64 {
	var id uint64
	if r := p.drv.CtxGetId.Call(h, uintptr(unsafe.Pointer(&id))); !ok(r) {
		return 0
	}
	return id
}

// ContextFlags are cuCtxCreate flags (CU_CTX_*).
type ContextFlags uint32

// Context creation flags. At most one scheduling flag (the low three bits)
// may be set.
const (
	ContextSchedAuto         ContextFlags = 0x00 // the driver chooses how the host waits
	ContextSchedSpin         ContextFlags = 0x01 // spin while waiting for the GPU
	ContextSchedYield        ContextFlags = 0x02 // yield the thread while waiting
	ContextSchedBlockingSync ContextFlags = 0x04 // block on a synchronization primitive
	ContextMapHost           ContextFlags = 0x08 // deprecated: always on since CUDA 11
	ContextLmemResizeToMax   ContextFlags = 0x10 // deprecated: always on
	ContextCoredumpEnable    ContextFlags = 0x20 // write a GPU coredump on an exception
	ContextUserCoredump      ContextFlags = 0x40 // coredumps on request through a pipe
	ContextSyncMemops        ContextFlags = 0x80 // synchronous memory operations always synchronize
	contextFlagsMask         ContextFlags = 0xFF
	contextSchedMask         ContextFlags = 0x07
)

// views is the registry of non-primary views by context handle, so that
// WrapContext returns one *Device per context and a view from NewContext
// is found again by its handle.
var views = struct {
	mu sync.Mutex
	m  map[uintptr]*Device
}{m: map[uintptr]*Device{}}

// IsPrimary reports whether d is a view of its GPU's primary context (the
// values GetDevice returns); false for a nil or zero Device and for views
// from WrapContext and NewContext.
func (d *Device) IsPrimary() bool { return d.valid() && d.bind == nil }

// Primary returns the primary view of d's GPU: d itself for a primary
// view, nil for a nil or zero Device.
func (d *Device) Primary() *Device {
	switch {
	case !d.valid():
		return nil
	case d.bind != nil:
		return d.bind.primary
	}
	return d
}

// SameGPU reports whether d and other are views of the same GPU (of one
// driver), whatever their contexts. It is false if either is nil or zero.
func (d *Device) SameGPU(other *Device) bool {
	return d.valid() && other.valid() && d.Primary() == other.Primary()
}

// contextClosed is the error for a call named op on a view whose owned
// context was destroyed, nil otherwise.
func (d *Device) contextClosed(op string) error {
	if d.bind == nil || !d.bind.closed.Load() {
		return nil
	}
	return &OpError{Op: op, Err: fmt.Errorf("%w: context %#x of %v was destroyed (Context.Close)", ErrClosed, d.ctx, d.bind.primary)}
}

// contextClosedDone reports whether d is a view whose owned context
// Context.Close destroyed, green or not: nothing of it may be handed to
// the driver again, so Close of an object made in it makes no driver
// call and reports what diedWith says.
func (d *Device) contextClosedDone() bool { return d != nil && d.bind != nil && d.bind.closed.Load() }

// diedWith is what Close (op) of an object of view d (what, handle h)
// reports once Context.Close destroyed d's context (contextClosedDone):
// nil for an ordinary context, whose cuCtxDestroy destroyed the object;
// for a green context, whose objects CUDA leaks, the leak, matching
// ErrClosed (the caller keeps it for every later Close).
func (d *Device) diedWith(op, what string, h uintptr) error {
	g := d.green()
	if g == 0 {
		return nil
	}
	return &OpError{Op: op, Err: fmt.Errorf("%w: %s %#x was still open when Context.Close destroyed green context %#x of %v; CUDA does not destroy a green context's objects with it and refuses every later call on them, so it is marked closed without a driver call and its driver object is leaked (close it before its context)",
		ErrClosed, what, h, g, d.bind.primary)}
}

// WrapContext returns the Device view of h, a CUcontext made elsewhere, so
// that every cudamem object made from it runs with h current. cudamem
// never destroys h; it must outlive every use of the view. A primary
// context gives the GPU's primary view; the same h gives the same view
// each time.
//
// Handle 0 is an error matching ErrInvalidArgument. A context cudamem
// destroyed is refused before any driver call (which may crash on it),
// with an error naming the handle that matches both ErrInvalidArgument and
// CUDA_ERROR_INVALID_CONTEXT; so is a context another library creates
// later at that address, until cudamem creates one there. A context
// destroyed elsewhere goes to the driver, which may crash: pass only live
// contexts.
func WrapContext(h uintptr) (*Device, error) {
	const op = "WrapContext"
	if h == 0 {
		return nil, Errorf(op, ErrInvalidArgument, "context handle 0 (no context)")
	}
	// Before any driver call: cuCtxGetDevice and cuCtxGetId on a
	// destroyed context read freed memory.
	if err := refuseDestroyed(op, kindContext, h); err != nil {
		return nil, err
	}
	ds, err := devices()
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		return nil, &OpError{Op: op, Err: fmt.Errorf("context %#x: %w", h, ErrorNoDevice)}
	}
	drv := ds[0].drv
	var cu int32
	if r := drv.CtxGetDevice.CallCtx(h, uintptr(unsafe.Pointer(&cu))); !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("context %#x: %w", h, fail(&drv.CtxGetDevice, r))}
	}
	var p *Device
	for _, d := range ds {
		if d.handle == cu {
			p = d
		}
	}
	if p == nil {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: context %#x is on CUdevice %d, which the device list lacks", ErrorInvalidDevice, h, cu)}
	}
	// Only a primary context already retained is compared: retaining it
	// here would create it for a program that never asked for it.
	if p.ctxOK.Load() && p.ctx == h {
		return p, nil
	}
	views.mu.Lock()
	defer views.mu.Unlock()
	// A handle seen before is the same view, unless the driver reused the
	// address for another context (another GPU, or two known, different
	// IDs): the old view's cached objects are dead.
	id := contextID(p, h)
	if v := views.m[h]; v != nil && v.bind.primary == p && !v.bind.closed.Load() {
		switch {
		case v.bind.id == 0:
			v.bind.id = id // views.mu held
			return v, nil
		case id == 0 || id == v.bind.id:
			return v, nil
		}
	}
	v := newView(p, h, false)
	v.bind.id = id
	views.m[h] = v
	return v, nil
}

// newView makes a view of p's GPU through context h.
func newView(p *Device, h uintptr, owned bool) *Device {
	v := &Device{ordinal: p.ordinal, handle: p.handle, drv: p.drv, bind: &binding{primary: p, owned: owned}}
	v.setContext(h)
	v.defaultStream = Stream{dev: v}
	return v
}

// Context is a CUDA context cudamem created (Device.NewContext) and owns:
// Close destroys it. Device returns its view, which every constructor
// taking a *Device accepts, and every driver call made through what it
// returns runs with the view's context current. Methods are safe for
// concurrent use; closing the context while other goroutines still use
// its view is a program error (as in CUDA). A nil or zero Context refuses
// every call.
//
// Views compare by pointer, one per context; Ordinal, UUID, attributes and
// Features are the GPU's. Objects CUDA ties to a context (streams, events,
// modules, cuMemAlloc memory) belong to one view, and used with another
// are an error naming both; pools and virtual memory belong to the GPU.
// Stream.WaitEvent accepts events of any context, as CUDA does.
//
// After Close every call through the view, and through anything made from
// it, returns an error matching ErrClosed. Close objects made in a context
// before the context: destroying it destroys its streams, events, modules
// and cuMemAlloc memory in the driver (their Close then only marks them
// closed), while pool allocations outlive it but can no longer be freed
// through the closed view (green contexts differ: see
// Device.NewGreenContext). Views from WrapContext are kept for the life
// of the process, a few hundred bytes each.
type Context struct {
	dev *Device // the view; nil for a zero Context
	mu  sync.Mutex
}

// NewContext creates a CUDA context on d's GPU (cuCtxCreate_v4 where the
// driver has it, else cuCtxCreate_v2) with the given flags, and returns it
// owned: Context.Close destroys it. d may be any view of the GPU. The
// calling thread's current context is left as it was. Flags outside
// CU_CTX_FLAGS_MASK, or more than one scheduling flag, are an error
// matching ErrInvalidArgument.

func (d *Device) NewContext(flags ContextFlags) (*Context, error) {
	const op = "Device.NewContext"
	if err := d.check(op); err != nil {
		return nil, err
	}
	if flags&^contextFlagsMask != 0 {
		return nil, Errorf(op, ErrInvalidArgument, "context flags %#x outside the mask %#x", uint32(flags), uint32(contextFlagsMask))
	}
	if s := flags & contextSchedMask; s&(s-1) != 0 {
		return nil, Errorf(op, ErrInvalidArgument, "context flags %#x set more than one scheduling flag", uint32(flags))
	}
	p := d.Primary()
	drv := d.drv
	create := &drv.CtxCreateV4
	if !create.Found() {
		create = &drv.CtxCreate
	}
	for _, need := range []*struct {
		ok   bool
		name string
	}{{create.Found(), "cuCtxCreate"}, {drv.CtxDestroy.Found(), "cuCtxDestroy"}, {drv.CtxPopCurrent.Found(), "cuCtxPopCurrent"}} {
		if !need.ok {
			return nil, &OpError{Op: op, Err: fmt.Errorf("%w: the installed driver does not provide %s", ErrNotSupported, need.name)}
		}
	}
	// The push and the pop must happen on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var c uintptr
	var r uintptr
	if create == &drv.CtxCreateV4 {
		r = create.Call(uintptr(unsafe.Pointer(&c)), 0, uintptr(flags), uintptr(p.handle))
	} else {
		r = create.Call(uintptr(unsafe.Pointer(&c)), uintptr(flags), uintptr(p.handle))
	}
	if !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%v, flags %#x: %w", p, uint32(flags), fail(create, r))}
	}
	if c == 0 {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: cuCtxCreate succeeded with a NULL context", ErrorUnknown)}
	}
	var popped uintptr
	if r := drv.CtxPopCurrent.Call(uintptr(unsafe.Pointer(&popped))); !ok(r) || popped != c {
		// cuCtxDestroy also pops the context if it is still current here.
		err := fmt.Errorf("%w: popping the new context %#x popped %#x instead", ErrorUnknown, c, popped)
		if !ok(r) {
			err = fmt.Errorf("popping the new context %#x: %w", c, fail(&drv.CtxPopCurrent, r))
		}
		if dr := drv.CtxDestroy.Call(c); !ok(dr) {
			err = errors.Join(err, fmt.Errorf("destroying it: %w", fail(&drv.CtxDestroy, dr)))
		}
		return nil, &OpError{Op: op, Err: err}
	}
	noteLive(kindContext, c) // the address of a destroyed context, reused
	v := newView(p, c, true)
	v.bind.id = contextID(p, c)
	views.mu.Lock()
	views.m[c] = v
	views.mu.Unlock()
	return &Context{dev: v}, nil
}

// Device returns the context's view (nil for a nil or zero Context). It
// stays valid after Close, refusing calls with ErrClosed.
func (c *Context) Device() *Device {
	if c == nil {
		return nil
	}
	return c.dev
}

// Handle is the CUcontext, or 0 for a nil, zero or closed Context.
func (c *Context) Handle() uintptr {
	if c == nil || c.dev == nil || c.dev.bind.closed.Load() {
		return 0
	}
	return c.dev.ctx
}

// IsClosed reports whether Close destroyed the context (true for a nil or
// zero Context).
func (c *Context) IsClosed() bool { return c == nil || c.dev == nil || c.dev.bind.closed.Load() }

// String names the context and its GPU.
func (c *Context) String() string {
	if c == nil || c.dev == nil {
		return "Context(nil)"
	}
	if c.IsClosed() {
		return fmt.Sprintf("Context(closed, %v)", c.dev.bind.primary)
	}
	return fmt.Sprintf("Context(%#x, %v)", c.dev.ctx, c.dev.bind.primary)
}

// Sync waits for all work in the context to finish (cuCtxSynchronize).
func (c *Context) Sync() error {
	if c == nil || c.dev == nil {
		return Errorf("Context.Sync", ErrInvalidArgument, "nil or zero Context (use Device.NewContext)")
	}
	return c.dev.Sync()
}

// Close waits for the context's work to finish, then destroys it
// (cuCtxDestroy), with its streams, events, modules and cuMemAlloc
// memory. It is idempotent, and a nil or zero Context does nothing. If the
// driver refuses to destroy it, the context stays open and usable.
// Afterwards the view refuses every call with ErrClosed.
func (c *Context) Close() error {
	const op = "Context.Close"
	if c == nil || c.dev == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.dev
	if v.bind.closed.Load() {
		return nil
	}
	drv := v.drv
	// Waiting for the context would invalidate a capture in progress on
	// one of its streams (the capture rule): end it first. No capture
	// can begin from the check until the context is gone (the gate).
	if err := v.refuseContextWait(op); err != nil {
		return err
	}
	defer v.exitContextWait()
	// Finish submitted work first; a sticky error here (a faulted kernel)
	// must not keep the context alive, so it is only reported.
	serr := result(&drv.CtxSynchronize, drv.CtxSynchronize.CallCtx(v.ctx))
	// New calls through the view fail from here on; undone if the destroy
	// fails.
	v.bind.closed.Store(true)
	destroy, h := &drv.CtxDestroy, v.ctx
	if g := v.green(); g != 0 {
		destroy, h = &drv.GreenCtxDestroy, g
	}
	if r := destroy.Call(h); !ok(r) {
		v.bind.closed.Store(false)
		return &OpError{Op: op, Err: errors.Join(fmt.Errorf("context %#x of %v: %w", h, v.bind.primary, fail(destroy, r)), serr)}
	}
	views.mu.Lock()
	if views.m[v.ctx] == v {
		delete(views.m, v.ctx)
	}
	views.mu.Unlock()
	// Recorded so that WrapContext, WrapGreenContext and WrapStream refuse
	// the dead handles instead of handing them to the driver.
	green := uintptr(0)
	if destroy == &drv.GreenCtxDestroy {
		green = h
	}
	contextDestroyed(v, green, op)
	if serr != nil {
		return &OpError{Op: op, Err: fmt.Errorf("context %#x destroyed; its work had failed: %w", v.ctx, serr)}
	}
	return nil
}
