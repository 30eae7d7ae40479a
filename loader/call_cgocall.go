//go:build linux && (amd64 || arm64)

package loader

import "unsafe"

// frame is the record the trampoline reads: it lives on the caller's stack
// for the duration of one call (no heap allocation per call). Its field
// offsets reach the assembly through go_asm.h.
//
// The stack can move while C runs: a C function that calls back into Go
// (a purego callback, such as a DLPack deleter) runs that Go code on this
// goroutine's stack, which may grow, or be shrunk by the garbage collector
// while the callback blocks. So the trampoline keeps the record's depth
// below the top of the stack (g.stack.hi), not its address, and finds it
// again after the C call, as cgo's generated code does with
// _cgo_topofstack: a result written through the old address would be lost
// in freed stack memory that another goroutine may already own.
type frame struct {
	fn    uintptr
	ctxfn uintptr // cuCtxSetCurrent, called first with ctx when non-zero
	ctx   uintptr
	g     uintptr // the calling goroutine's runtime g; see gStackHi
	args  [MaxArgs]uintptr
	ret   uintptr
}

// gStackHi is the offset of stack.hi in the runtime's g: its first field
// is the stack's bounds [lo, hi), an offset the runtime documents as
// known to runtime/cgo (whose C code reads it), so it does not change
// between Go releases. g itself is never moved or freed. Only the
// assembly reads it (through go_asm.h).
//
//lint:ignore U1000 used by call_linux_*.s
const gStackHi = unsafe.Sizeof(uintptr(0))

// getg returns the current goroutine's runtime g (assembly: it reads the
// g register or thread-local slot; it never moves the stack).
func getg() uintptr

// trampolineABI0 is the address of the assembly trampoline, which expects
// the C calling convention with a *frame as its one argument.
var trampolineABI0 uintptr

//go:linkname runtime_cgocall runtime.cgocall
//go:noescape
func runtime_cgocall(fn uintptr, arg unsafe.Pointer) int32

// Call calls the entry point with integer arguments and returns its result
// register (for CUDA, a CUresult). An unresolved Proc returns NotFound, as
// does a call with more than MaxArgs arguments.
//
// Call is nosplit so that uintptr(unsafe.Pointer(&x)) arguments computed
// by the caller stay valid: the goroutine stack cannot move before the C
// call begins, nor during it unless the C function calls back into Go
// (see frame, and the package doc on callbacks). It is also norace: the
// race detector's instrumentation would otherwise insert calls that can
// grow (and so move) the stack, losing the driver's writes.
//
//go:nosplit
//go:norace
func (p *Proc) Call(args ...uintptr) uintptr {
	if p == nil {
		return NotFound
	}
	return call(p.addr, 0, 0, args)
}

// CallCtx is Call with the CUDA context ctx made current (cuCtxSetCurrent
// of the entry point's own driver) on the OS thread that runs the call,
// inside the same crossing into C. If setting the context fails its
// CUresult is returned and the entry point is not called. A Proc from a
// library without cuCtxSetCurrent (Library.Lookup) returns NotFound.
//
//go:nosplit
//go:norace
func (p *Proc) CallCtx(ctx uintptr, args ...uintptr) uintptr {
	if p == nil || p.setCtx == 0 {
		return NotFound
	}
	return call(p.addr, p.setCtx, ctx, args)
}

//go:nosplit
//go:norace
func call(fn, ctxfn, ctx uintptr, args []uintptr) uintptr {
	if fn == 0 || len(args) > MaxArgs {
		return NotFound
	}
	// Fault injection (build tag cudamemfault): faultEnabled is a constant,
	// so in normal builds this branch and the call vanish. faultHit is
	// nosplit and uses only sync/atomic, so it cannot move the stack.
	if faultEnabled {
		if r, hit := faultHit(fn); hit {
			return r
		}
	}
	f := frame{fn: fn, ctxfn: ctxfn, ctx: ctx, g: getg()}
	// A loop, not copy: under -race copy becomes runtime.slicecopy, an
	// ordinary function whose prologue may move the stack.
	//lint:ignore S1001 copy must not be used here (see above)
	for i, a := range args {
		f.args[i] = a
	}
	runtime_cgocall(trampolineABI0, unsafe.Pointer(&f))
	return f.ret
}
