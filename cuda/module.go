package cuda

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Module is a loaded CUDA module (PTX or cubin). cudamem's own tests and
// tools use modules to touch memory from the device side; it is not a
// kernel-programming API.
type Module struct {
	dev    *Device
	handle uintptr
}

// LoadModule loads a PTX or cubin image into the device's primary context
// (cuModuleLoadData); PTX is compiled for the device by the driver.
func (d *Device) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, Errorf("cuModuleLoadData", ErrInvalidArgument, "empty image")
	}
	ctx, err := d.context()
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
	return m, nil
}

// Close unloads the module.
func (m *Module) Close() error {
	if m == nil || m.handle == 0 {
		return nil
	}
	ctx, err := m.dev.context()
	if err != nil {
		return err
	}
	if r := m.dev.drv.ModuleUnload.CallCtx(ctx, m.handle); !ok(r) {
		return fail(&m.dev.drv.ModuleUnload, r)
	}
	m.handle = 0
	return nil
}

// Function is a kernel in a Module.
type Function struct {
	mod    *Module
	name   string
	handle uintptr
}

// Function looks up a kernel by name.
func (m *Module) Function(name string) (*Function, error) {
	if m == nil || m.handle == 0 {
		return nil, &OpError{Op: "cuModuleGetFunction", Err: ErrClosed}
	}
	ctx, err := m.dev.context()
	if err != nil {
		return nil, err
	}
	cname := append([]byte(name), 0)
	f := &Function{mod: m, name: name}
	r := m.dev.drv.ModuleGetFunction.CallCtx(ctx, uintptr(unsafe.Pointer(&f.handle)), m.handle, uintptr(unsafe.Pointer(&cname[0])))
	runtime.KeepAlive(cname)
	if !ok(r) {
		return nil, fmt.Errorf("kernel %q: %w", name, fail(&m.dev.drv.ModuleGetFunction, r))
	}
	return f, nil
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// Launch runs the kernel on s with the given grid and block shapes.
// Parameters must be uint64, uint32, int64, int32, DevicePtr or uintptr,
// in the kernel's parameter order.
func (f *Function) Launch(s *Stream, grid, block Dim3, sharedMem uint32, params ...any) error {
	vals := make([]uint64, len(params))
	ptrs := make([]unsafe.Pointer, len(params)+1)
	for i, p := range params {
		switch v := p.(type) {
		case uint64:
			vals[i] = v
		case int64:
			vals[i] = uint64(v)
		case DevicePtr:
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
	norm := func(d Dim3) Dim3 {
		if d.X == 0 {
			d.X = 1
		}
		if d.Y == 0 {
			d.Y = 1
		}
		if d.Z == 0 {
			d.Z = 1
		}
		return d
	}
	grid, block = norm(grid), norm(block)
	ctx, h, err := s.begin("cuLaunchKernel")
	if err != nil {
		return err
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
