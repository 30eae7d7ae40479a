package cuda

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cudamem/cudamem/internal/asleep"
)

// Module is a loaded CUDA module (PTX or cubin). cudamem's own tests and
// tools use modules to touch memory from the device side; it is not a
// kernel-programming API.
//
// Close unloads it; afterwards Function and launches of its kernels return
// an error matching ErrClosed. A nil or zero Module is refused the same way
// (ErrInvalidArgument). Methods are safe for concurrent use.
type Module struct {
	dev    *Device
	handle uintptr

	guard Guard // calls in flight, then Close
	// diedErr is what Close reports, each time, for a module closed after
	// Context.Close destroyed its green context (Device.diedWith).
	diedErr error
}

// LoadModule loads a PTX or cubin image into the device's primary context
// (cuModuleLoadData); PTX is compiled for the device by the driver.
func (d *Device) LoadModule(image []byte) (*Module, error) {
	if err := d.check("cuModuleLoadData"); err != nil {
		return nil, err
	}
	if len(image) == 0 {
		return nil, Errorf("cuModuleLoadData", ErrInvalidArgument, "empty image")
	}
	ctx, err := d.contextFor("Device.LoadModule")
	if err != nil {
		return nil, err
	}
	img := append(append([]byte(nil), image...), 0) // PTX text must be NUL-terminated
	m := &Module{dev: d}
	r := d.drv.ModuleLoadData.CallCtx(ctx, uintptr(unsafe.Pointer(&m.handle)), uintptr(unsafe.Pointer(&img[0])))
	runtime.KeepAlive(img)
	if !ok(r) {
		return nil, fail(&d.drv.ModuleLoadData, r)
	}
	if m.handle == 0 {
		return nil, zeroHandleErr("Device.LoadModule", "cuModuleLoadData", "module handle")
	}
	return m, nil
}

// begin checks m for a call named op and holds it open (entered in its guard)
// until end, so Close cannot unload it mid-call.
func (m *Module) begin(op string) (ctx uintptr, err error) {
	if m == nil || m.dev == nil {
		return 0, Errorf(op, ErrInvalidArgument, "nil or zero module (use Device.LoadModule)")
	}
	if !m.guard.Enter() {
		return 0, &OpError{Op: op, Err: ErrClosed}
	}
	if ctx, err = m.dev.contextFor(op); err != nil {
		m.guard.Leave()
		return 0, err
	}
	return ctx, nil
}

func (m *Module) end() { m.guard.Leave() }

// Close unloads the module. It is idempotent; closing a nil or zero Module
// does nothing. If unloading fails the module stays open. After
// Context.Close destroyed the module's context, Close reports as
// Stream.Close does: close modules before their context.
func (m *Module) Close() error {
	if m == nil || m.dev == nil {
		return nil
	}
	return closeHandle(&m.guard, m.dev, "Module.Close", "module", m.handle, &m.diedErr, func(ctx uintptr) error {
		if r := m.dev.drv.ModuleUnload.CallCtx(ctx, m.handle); !ok(r) {
			return fail(&m.dev.drv.ModuleUnload, r)
		}
		return nil
	})
}

// Function is a kernel in a Module.
type Function struct {
	mod    *Module
	name   string
	handle uintptr
}

// Function looks up a kernel by name.
func (m *Module) Function(name string) (*Function, error) {
	ctx, err := m.begin("cuModuleGetFunction")
	if err != nil {
		return nil, err
	}
	defer m.end()
	cname := append([]byte(name), 0)
	f := &Function{mod: m, name: name}
	r := m.dev.drv.ModuleGetFunction.CallCtx(ctx, uintptr(unsafe.Pointer(&f.handle)), m.handle, uintptr(unsafe.Pointer(&cname[0])))
	runtime.KeepAlive(cname)
	if !ok(r) {
		return nil, fmt.Errorf("kernel %q: %w", name, fail(&m.dev.drv.ModuleGetFunction, r))
	}
	if f.handle == 0 {
		return nil, zeroHandleErr("cuModuleGetFunction", "cuModuleGetFunction", fmt.Sprintf("function handle for kernel %q", name))
	}
	return f, nil
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// Launch runs the kernel on s with the given grid and block shapes.
// Parameters must be uint64, uint32, int64, int32, DevicePtr or uintptr,
// in the kernel's parameter order.
//
// A nil or zero Function is refused (ErrInvalidArgument), and so is one
// whose module was closed or whose context Context.Close destroyed
// (ErrClosed), before the driver sees the dead kernel handle.
func (f *Function) Launch(s *Stream, grid, block Dim3, sharedMem uint32, params ...any) error {
	if f == nil || f.mod == nil || f.handle == 0 {
		return Errorf("cuLaunchKernel", ErrInvalidArgument, "nil or zero kernel function (use Module.Function)")
	}
	vals := make([]uint64, len(params))
	ptrs := make([]unsafe.Pointer, len(params)+1)
	for i, p := range params {
		switch v := p.(type) {
		case uint64:
			vals[i] = v
		case int64:
			vals[i] = uint64(v)
		case DevicePtr:
			if err := asleep.Check(uint64(v), 0); err != nil {
				return fmt.Errorf("kernel %s parameter %d (%#x): %w", f.name, i, uint64(v), &OpError{Op: "cuLaunchKernel", Err: err})
			}
			vals[i] = uint64(v)
		case uintptr:
			vals[i] = uint64(v)
		case uint32:
			vals[i] = uint64(v) // little-endian: the low 4 bytes are the u32
		case int32:
			vals[i] = uint64(uint32(v))
		default:
			return Errorf("cuLaunchKernel", ErrInvalidArgument, "kernel %s parameter %d has unsupported type %T", f.name, i, p)
		}
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	norm := func(d Dim3) Dim3 { return Dim3{max(d.X, 1), max(d.Y, 1), max(d.Z, 1)} }
	grid, block = norm(grid), norm(block)
	// The module stays loaded for the launch: a kernel of an unloaded
	// module is a dangling driver handle.
	if _, err := f.mod.begin("cuLaunchKernel"); err != nil {
		return fmt.Errorf("kernel %s: %w", f.name, err)
	}
	defer f.mod.end()
	ctx, h, err := s.begin("cuLaunchKernel")
	if err != nil {
		return err
	}
	if s.dev != f.mod.dev {
		s.end()
		return Errorf("cuLaunchKernel", ErrInvalidArgument, "kernel %s is loaded in %s, and %s belongs to %s", f.name, f.mod.dev.contextName(), s.name(), s.dev.contextName())
	}
	drv := f.mod.dev.drv
	r := drv.LaunchKernel.CallCtx(ctx, f.handle, uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z), uintptr(sharedMem), h,
		uintptr(unsafe.Pointer(&ptrs[0])), 0)
	s.end()
	runtime.KeepAlive(vals)
	runtime.KeepAlive(ptrs)
	if !ok(r) {
		return fmt.Errorf("kernel %s: %w", f.name, fail(&drv.LaunchKernel, r))
	}
	return nil
}
