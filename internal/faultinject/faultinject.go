//go:build cudamemfault

package faultinject

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Fault-injection state. Every field is read and written with sync/atomic
// only: Hit runs inside the loader's nosplit call path, where an ordinary
// function call (a mutex, a map) could grow the stack and invalidate the
// caller's uintptr(unsafe.Pointer(&x)) arguments.
var (
	count    int64   // driver calls since the last FailCall/Reset
	at       int64   // fail the call whose count equals this; 0 = disarmed
	result   int32   // the CUresult the one-shot failure returns
	everyFn  uintptr // fail every call of this entry point; 0 = none
	everyRes int32   // the CUresult those calls return
	firedFn  uintptr // the entry point most recently failed
	fired    int64   // injected failures since the last reset
)

// Hit counts one call to the function at fn and reports whether it must
// fail, and with what raw result. The result is zero-extended from 32
// bits, as a C int comes back in a register, so it never equals
// loader.NotFound. The loader calls it before every call of a resolved
// Proc, on the nosplit path: it calls nothing that can grow the stack.
//
//go:nosplit
//go:norace
func Hit(fn uintptr) (uintptr, bool) {
	n := atomic.AddInt64(&count, 1)
	if atomic.LoadInt32(&traceOn) != 0 {
		if i := atomic.AddInt64(&traceLen, 1) - 1; i >= 0 && i < traceCap {
			atomic.StoreUintptr(&traceBuf[i], fn)
		}
	}
	if every := atomic.LoadUintptr(&everyFn); every != 0 && every == fn {
		atomic.StoreUintptr(&firedFn, fn)
		atomic.AddInt64(&fired, 1)
		return uintptr(uint32(atomic.LoadInt32(&everyRes))), true
	}
	// CompareAndSwap makes the failure one-shot even when calls race.
	if k := atomic.LoadInt64(&at); k != 0 && n == k && atomic.CompareAndSwapInt64(&at, k, 0) {
		atomic.StoreUintptr(&firedFn, fn)
		atomic.AddInt64(&fired, 1)
		return uintptr(uint32(atomic.LoadInt32(&result))), true
	}
	return 0, false
}

// FailCall arms a one-shot fault: the k-th driver call from now (counting
// every Proc.Call and Proc.CallCtx of a resolved entry point, in any
// goroutine) returns res without reaching the driver. It resets the call
// counter and the record of failed calls. k < 1 disarms.
func FailCall(k int64, res int32) {
	atomic.StoreInt64(&at, 0)
	atomic.StoreInt32(&result, res)
	atomic.StoreInt64(&count, 0)
	atomic.StoreInt64(&fired, 0)
	atomic.StoreUintptr(&firedFn, 0)
	if k > 0 {
		atomic.StoreInt64(&at, k)
	}
}

// FailEvery makes every call of the function at addr (Proc.Addr) return
// res until Reset or another FailEvery. addr 0 stops it.
func FailEvery(addr uintptr, res int32) {
	atomic.StoreInt32(&everyRes, res)
	atomic.StoreUintptr(&everyFn, addr)
}

// Calls returns the number of driver calls since the last FailCall or
// Reset: run an operation after Reset to learn how many calls it makes,
// and so which k to sweep.
func Calls() int64 { return atomic.LoadInt64(&count) }

// Fired returns how many calls were failed by injection since the last
// FailCall or Reset, and the address of the entry point failed most
// recently (0 if none); ProcName names it.
func Fired() (n int64, addr uintptr) {
	return atomic.LoadInt64(&fired), atomic.LoadUintptr(&firedFn)
}

// Armed reports whether a one-shot fault is still waiting to fire.
func Armed() bool { return atomic.LoadInt64(&at) != 0 }

// Reset disarms every fault and zeroes the counters.
func Reset() {
	atomic.StoreInt64(&at, 0)
	atomic.StoreUintptr(&everyFn, 0)
	atomic.StoreInt64(&count, 0)
	atomic.StoreInt64(&fired, 0)
	atomic.StoreUintptr(&firedFn, 0)
}

// Call tracing: while a trace is on, Hit records the entry point of every
// driver call (injected failures included), up to traceCap calls, so tests
// can assert the exact sequence an operation makes. Like the rest of the
// state it is touched with sync/atomic only.
const traceCap = 1 << 12

var (
	traceOn  int32
	traceLen int64
	traceBuf [traceCap]uintptr
)

// TraceStart starts recording the entry point of every driver call, in
// any goroutine, discarding what an earlier trace recorded.
func TraceStart() {
	atomic.StoreInt32(&traceOn, 0)
	atomic.StoreInt64(&traceLen, 0)
	atomic.StoreInt32(&traceOn, 1)
}

// TraceStop stops recording and returns the names of the calls made since
// TraceStart, in order (as ProcName gives them). If more than the
// recorder's capacity were made, the last element says how many were left
// out.
func TraceStop() []string {
	atomic.StoreInt32(&traceOn, 0)
	n := atomic.LoadInt64(&traceLen)
	kept := min(n, traceCap)
	out := make([]string, 0, kept+1)
	for i := int64(0); i < kept; i++ {
		out = append(out, ProcName(atomic.LoadUintptr(&traceBuf[i])))
	}
	if n > kept {
		out = append(out, fmt.Sprintf("(%d more calls not recorded)", n-kept))
	}
	return out
}

// names maps the address of every driver entry point the loader resolved
// (in any driver it opened) to its base name.
var names struct {
	sync.Mutex
	m map[uintptr]string
}

// Note records that the function at addr is the entry point name. The
// loader calls it for every entry point it resolves, so that ProcName can
// name the calls Fired and TraceStop report.
func Note(addr uintptr, name string) {
	if addr == 0 {
		return
	}
	names.Lock()
	defer names.Unlock()
	if names.m == nil {
		names.m = map[uintptr]string{}
	}
	names.m[addr] = name
}

// ProcName returns the base name of the driver entry point at addr
// ("cuMemAlloc"), "" for 0, or a hex address if the loader resolved no
// entry point there.
func ProcName(addr uintptr) string {
	if addr == 0 {
		return ""
	}
	names.Lock()
	defer names.Unlock()
	if n, ok := names.m[addr]; ok {
		return n
	}
	return fmt.Sprintf("%#x", addr)
}

// Addr returns the address of the driver entry point the loader resolved
// under base name name ("cuGraphDestroy"), for FailEvery, or 0 if none.
func Addr(name string) uintptr {
	names.Lock()
	defer names.Unlock()
	for addr, n := range names.m {
		if n == name {
			return addr
		}
	}
	return 0
}
