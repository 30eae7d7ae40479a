package loader

// Bind returns p, an entry point found in another library (cuBLAS, cuFFT,
// NCCL, ... through Library.Lookup), bound to d's cuCtxSetCurrent, so that
// its CallCtx makes a CUDA context current on the OS thread that runs the
// call, inside the same crossing into C, exactly as for the driver's own
// entry points. Without Bind, CallCtx on such a Proc returns NotFound.
//
// A nil Driver, or one without cuCtxSetCurrent, leaves p unbound (its
// CallCtx keeps returning NotFound); Call is unaffected either way.
//
// A non-zero result of CallCtx is either the CUresult of cuCtxSetCurrent
// (the function was then not called) or the function's own result: the
// two cannot be told apart from the value alone. Package cuda's
// Device.Foreign does the telling (see cuda.ForeignFunc.Call); use it
// rather than Bind unless you manage contexts yourself.
func (d *Driver) Bind(p Proc) Proc {
	if d == nil || d.ctxSetCurrent.addr == 0 {
		return p
	}
	p.setCtx = d.ctxSetCurrent.addr
	return p
}

// Bound reports whether CallCtx can set a context for p: true for the
// driver's own entry points and for those returned by Driver.Bind (false
// for a nil Proc).
func (p *Proc) Bound() bool { return p != nil && p.setCtx != 0 }

// ProcAt returns a Proc for the C function at addr: a function pointer
// that foreign code handed over rather than one found by name (a DLPack
// tensor's deleter, an entry of a callback table). name is for errors and
// logs only. The loader cannot check addr: the caller vouches that it is
// a function with the C calling convention taking integer or pointer
// arguments, and that it stays loaded while the Proc is used. A zero addr
// gives an unresolved Proc, whose Call returns NotFound. The Proc is
// unbound (its CallCtx returns NotFound; see Driver.Bind).
func ProcAt(addr uintptr, name string) Proc { return Proc{addr: addr, name: name} }
