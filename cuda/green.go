package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

// devResource is CUdevResource (RESOURCE_ABI_VERSION 1): a tagged union
// of 144 bytes; the driver keeps its own data in the padding.
type devResource struct {
	Type uint32
	_    [92]byte
	SM   devSMResource // the union's CU_DEV_RESOURCE_TYPE_SM member, at offset 96
	_    [48 - 12]byte // the rest of the union (RESOURCE_ABI_EXTERNAL_BYTES)
}

// devSMResource is CUdevSmResource.
type devSMResource struct {
	SMCount, MinSMPartitionSize, SMCoscheduledAlignment uint32
}

const (
	devResourceTypeSM   = 1   // CU_DEV_RESOURCE_TYPE_SM
	greenCtxDefaultFlag = 0x1 // CU_GREEN_CTX_DEFAULT_STREAM (required)
)

// greenMissing returns the first green-context entry point the driver
// lacks, "" if it has them all.
func (d *Device) greenMissing() string {
	drv := d.drv
	for _, p := range []*struct {
		found bool
		name  string
	}{
		{drv.DeviceGetDevResource.Found(), "cuDeviceGetDevResource"},
		{drv.DevSmResourceSplitByCount.Found(), "cuDevSmResourceSplitByCount"},
		{drv.DevResourceGenerateDesc.Found(), "cuDevResourceGenerateDesc"},
		{drv.GreenCtxCreate.Found(), "cuGreenCtxCreate"},
		{drv.GreenCtxDestroy.Found(), "cuGreenCtxDestroy"},
		{drv.CtxFromGreenCtx.Found(), "cuCtxFromGreenCtx"},
		{drv.GreenCtxStreamCreate.Found(), "cuGreenCtxStreamCreate"},
	} {
		if !p.found {
			return p.name
		}
	}
	return ""
}

// NewGreenContext creates a green context on d's GPU holding one
// partition of at least minSMs streaming multiprocessors (the driver
// rounds up; Context.SMCount says how many it got), and returns it owned:
// Close destroys it. d may be any view of the GPU. minSMs must be between
// 1 and the GPU's SM count (ErrInvalidArgument otherwise). A driver older
// than CUDA 12.5, or a 32-bit build, reports ErrNotSupported.
//
// A green context's view works like any other (see Context), except:
//
//   - Its streams must be StreamNonBlocking (cuGreenCtxStreamCreate).
//   - Destroying it does not destroy its streams, events, modules and
//     graphs: CUDA leaks them. Close them before the context. A Close
//     afterwards makes no driver call, marks the object closed and returns
//     an error matching ErrClosed that says it leaked, on every Close.
func (d *Device) NewGreenContext(minSMs int) (*Context, error) {
	const op = "Device.NewGreenContext"
	if err := d.check(op); err != nil {
		return nil, err
	}
	if minSMs < 1 {
		return nil, Errorf(op, ErrInvalidArgument, "minimum SM count %d (at least 1)", minSMs)
	}
	if unsafe.Sizeof(uintptr(0)) < 8 {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: green contexts need a 64-bit platform", ErrNotSupported)}
	}
	if name := d.greenMissing(); name != "" {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: the installed driver does not provide %s", ErrNotSupported, name)}
	}
	p := d.Primary()
	pctx, err := p.contextFor(op) // cuGreenCtxCreate retains it anyway: have it active
	if err != nil {
		return nil, err
	}
	drv := d.drv
	var all devResource
	if r := drv.DeviceGetDevResource.CallCtx(pctx, uintptr(p.handle), uintptr(unsafe.Pointer(&all)), devResourceTypeSM); !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("SMs of %v: %w", p, fail(&drv.DeviceGetDevResource, r))}
	}
	if all.Type != devResourceTypeSM || all.SM.SMCount == 0 {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: the driver described %v's SMs as resource type %d with %d SMs", ErrorUnknown, p, all.Type, all.SM.SMCount)}
	}
	if uint64(minSMs) > uint64(all.SM.SMCount) {
		return nil, Errorf(op, ErrInvalidArgument, "minimum SM count %d exceeds the %d SMs of %v", minSMs, all.SM.SMCount, p)
	}
	var group devResource
	n := uint32(1)
	if r := drv.DevSmResourceSplitByCount.CallCtx(pctx, uintptr(unsafe.Pointer(&group)), uintptr(unsafe.Pointer(&n)),
		uintptr(unsafe.Pointer(&all)), 0, 0, uintptr(minSMs)); !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("splitting %d SMs of %v into groups of %d: %w", all.SM.SMCount, p, minSMs, fail(&drv.DevSmResourceSplitByCount, r))}
	}
	if n != 1 || group.Type != devResourceTypeSM || group.SM.SMCount == 0 {
		return nil, Errorf(op, ErrInvalidArgument, "%v's %d SMs hold no partition of at least %d SMs (the driver made %d groups)", p, all.SM.SMCount, minSMs, n)
	}
	var desc uintptr
	if r := drv.DevResourceGenerateDesc.CallCtx(pctx, uintptr(unsafe.Pointer(&desc)), uintptr(unsafe.Pointer(&group)), 1); !ok(r) {
		return nil, &OpError{Op: op, Err: fail(&drv.DevResourceGenerateDesc, r)}
	}
	var g uintptr
	if r := drv.GreenCtxCreate.CallCtx(pctx, uintptr(unsafe.Pointer(&g)), desc, uintptr(p.handle), greenCtxDefaultFlag); !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%d SMs of %v: %w", group.SM.SMCount, p, fail(&drv.GreenCtxCreate, r))}
	}
	if g == 0 {
		return nil, zeroHandleErr(op, "cuGreenCtxCreate", fmt.Sprintf("green context handle for %d SMs of %v", group.SM.SMCount, p))
	}
	var c uintptr
	if r := drv.CtxFromGreenCtx.Call(uintptr(unsafe.Pointer(&c)), g); !ok(r) || c == 0 {
		err := fmt.Errorf("converting green context %#x: %w", g, result(&drv.CtxFromGreenCtx, r))
		if ok(r) {
			err = fmt.Errorf("%w: cuCtxFromGreenCtx gave a NULL context for %#x", ErrorUnknown, g)
		}
		if dr := drv.GreenCtxDestroy.Call(g); !ok(dr) {
			err = errors.Join(err, fmt.Errorf("destroying it: %w", fail(&drv.GreenCtxDestroy, dr)))
		}
		return nil, &OpError{Op: op, Err: err}
	}
	noteLive(kindGreen, g) // addresses of destroyed ones, reused
	noteLive(kindContext, c)
	v := newView(p, c, true)
	v.bind.green = g
	v.bind.sms = int(group.SM.SMCount)
	v.bind.id = contextID(p, c)
	views.mu.Lock()
	views.m[c] = v
	views.mu.Unlock()
	return &Context{dev: v}, nil
}

// WrapGreenContext returns the Device view of h, a CUgreenCtx made
// elsewhere: every cudamem object made from it runs in the green context.
// cudamem never destroys h; it must outlive every use of the view. The
// same h gives the same view each time. Handle 0 is an error matching
// ErrInvalidArgument; a green context cudamem destroyed is refused before
// any driver call, matching both ErrInvalidArgument and
// CUDA_ERROR_INVALID_HANDLE (see WrapContext).
func WrapGreenContext(h uintptr) (*Device, error) {
	const op = "WrapGreenContext"
	if h == 0 {
		return nil, Errorf(op, ErrInvalidArgument, "green context handle 0")
	}
	if err := refuseDestroyed(op, kindGreen, h); err != nil {
		return nil, err
	}
	ds, err := devices()
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		return nil, &OpError{Op: op, Err: fmt.Errorf("green context %#x: %w", h, ErrorNoDevice)}
	}
	drv := ds[0].drv
	if !drv.CtxFromGreenCtx.Found() {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: the installed driver does not provide cuCtxFromGreenCtx", ErrNotSupported)}
	}
	var c uintptr
	if r := drv.CtxFromGreenCtx.Call(uintptr(unsafe.Pointer(&c)), h); !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("green context %#x: %w", h, fail(&drv.CtxFromGreenCtx, r))}
	}
	if c == 0 {
		return nil, zeroHandleErr(op, "cuCtxFromGreenCtx", fmt.Sprintf("context for green context %#x", h))
	}
	// The driver vouches for c, the live green context's own context,
	// even at an address where cudamem destroyed another.
	noteLive(kindContext, c)
	v, err := WrapContext(c)
	if err != nil {
		return nil, &OpError{Op: op, Err: fmt.Errorf("green context %#x: %w", h, err)}
	}
	if v.bind == nil {
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: green context %#x converts to %s", ErrorUnknown, h, v.contextName())}
	}
	views.mu.Lock()
	defer views.mu.Unlock()
	switch {
	case v.bind.green == 0:
		v.bind.green = h // first seen as a green context here
	case v.bind.green != h:
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: green context %#x converts to context %#x, already the view of green context %#x", ErrorUnknown, h, c, v.bind.green)}
	}
	return v, nil
}

// GreenContext is the CUgreenCtx of a green context's view (NewGreenContext,
// WrapGreenContext), 0 for any other Device.
func (d *Device) GreenContext() uintptr {
	if !d.valid() {
		return 0
	}
	return d.green()
}

// SMCount is the number of SMs in a green context made by
// NewGreenContext, 0 for other contexts (and nil or zero ones).
func (c *Context) SMCount() int {
	if c == nil || c.dev == nil {
		return 0
	}
	return c.dev.bind.sms
}

// green returns the view's CUgreenCtx (0 if not green).
func (d *Device) green() uintptr {
	if d == nil || d.bind == nil {
		return 0
	}
	views.mu.Lock()
	defer views.mu.Unlock()
	return d.bind.green
}
