//go:build cudamemfault

package loader

import (
	"fmt"
	"sync/atomic"
)

const faultEnabled = true

// Fault-injection state. Every field is read and written with sync/atomic
// only: faultHit runs inside the nosplit call path, where an ordinary
// function call (a mutex, a map) could grow the stack and invalidate the
// caller's uintptr(unsafe.Pointer(&x)) arguments.
var (
	faultCount    int64   // driver calls since the last FailCall/FaultReset
	faultAt       int64   // fail the call whose count equals this; 0 = disarmed
	faultResult   int32   // the CUresult the one-shot failure returns
	faultEveryFn  uintptr // fail every call of this entry point; 0 = none
	faultEveryRes int32   // the CUresult those calls return
	faultFiredFn  uintptr // the entry point most recently failed
	faultFired    int64   // injected failures since the last reset
)

// faultHit counts one driver call to fn and reports whether it must fail,
// and with what raw result. The result is zero-extended from 32 bits, as a
// C int comes back in a register, so it never equals NotFound.
//
//go:nosplit
//go:norace
func faultHit(fn uintptr) (uintptr, bool) {
	n := atomic.AddInt64(&faultCount, 1)
	if atomic.LoadInt32(&traceOn) != 0 {
		if i := atomic.AddInt64(&traceLen, 1) - 1; i >= 0 && i < traceCap {
			atomic.StoreUintptr(&traceBuf[i], fn)
		}
	}
	if every := atomic.LoadUintptr(&faultEveryFn); every != 0 && every == fn {
		atomic.StoreUintptr(&faultFiredFn, fn)
		atomic.AddInt64(&faultFired, 1)
		return uintptr(uint32(atomic.LoadInt32(&faultEveryRes))), true
	}
	// CompareAndSwap makes the failure one-shot even when calls race.
	if k := atomic.LoadInt64(&faultAt); k != 0 && n == k && atomic.CompareAndSwapInt64(&faultAt, k, 0) {
		atomic.StoreUintptr(&faultFiredFn, fn)
		atomic.AddInt64(&faultFired, 1)
		return uintptr(uint32(atomic.LoadInt32(&faultResult))), true
	}
	return 0, false
}

// FailCall arms a one-shot fault: the k-th driver call from now (counting
// every Proc.Call and Proc.CallCtx of a resolved entry point, in any
// goroutine) returns result without reaching the driver. It resets the
// call counter and the record of failed calls. k < 1 disarms.
//
// Only linux/amd64 and linux/arm64 (the trampoline call path) inject
// faults; elsewhere calls are never failed.
func FailCall(k int64, result int32) {
	atomic.StoreInt64(&faultAt, 0)
	atomic.StoreInt32(&faultResult, result)
	atomic.StoreInt64(&faultCount, 0)
	atomic.StoreInt64(&faultFired, 0)
	atomic.StoreUintptr(&faultFiredFn, 0)
	if k > 0 {
		atomic.StoreInt64(&faultAt, k)
	}
}

// FailEvery makes every call of the entry point at addr (Proc.Addr) return
// result until FaultReset or another FailEvery. addr 0 stops it.
func FailEvery(addr uintptr, result int32) {
	atomic.StoreInt32(&faultEveryRes, result)
	atomic.StoreUintptr(&faultEveryFn, addr)
}

// FaultCalls returns the number of driver calls since the last FailCall or
// FaultReset: run an operation after FaultReset to learn how many calls it
// makes, and so which k to sweep.
func FaultCalls() int64 { return atomic.LoadInt64(&faultCount) }

// Call tracing: while a trace is on, faultHit records the entry point of
// every driver call (injected failures included), up to traceCap calls, so
// tests can assert the exact sequence an operation makes. Like the rest of
// the fault state it is touched with sync/atomic only.
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

// TraceStop stops recording and returns the base names of the calls made
// since TraceStart, in order (names as ProcName gives them). If more than
// the recorder's capacity were made, the last element says how many were
// left out.
func (d *Driver) TraceStop() []string {
	atomic.StoreInt32(&traceOn, 0)
	n := atomic.LoadInt64(&traceLen)
	kept := min(n, traceCap)
	out := make([]string, 0, kept+1)
	for i := int64(0); i < kept; i++ {
		out = append(out, d.ProcName(atomic.LoadUintptr(&traceBuf[i])))
	}
	if n > kept {
		out = append(out, fmt.Sprintf("(%d more calls not recorded)", n-kept))
	}
	return out
}

// FaultFired returns how many calls were failed by injection since the
// last FailCall or FaultReset, and the address of the entry point failed
// most recently (0 if none); map it to a name with Driver.ProcName.
func FaultFired() (n int64, addr uintptr) {
	return atomic.LoadInt64(&faultFired), atomic.LoadUintptr(&faultFiredFn)
}

// FaultArmed reports whether a one-shot fault is still waiting to fire.
func FaultArmed() bool { return atomic.LoadInt64(&faultAt) != 0 }

// FaultReset disarms every fault and zeroes the counters.
func FaultReset() {
	atomic.StoreInt64(&faultAt, 0)
	atomic.StoreUintptr(&faultEveryFn, 0)
	atomic.StoreInt64(&faultCount, 0)
	atomic.StoreInt64(&faultFired, 0)
	atomic.StoreUintptr(&faultFiredFn, 0)
}

// ProcName returns the base name of the entry point at addr
// ("cuMemAlloc"), or a hex address if it is none of d's.
func (d *Driver) ProcName(addr uintptr) string {
	if addr == 0 {
		return ""
	}
	for _, p := range []*Proc{&d.getProcAddress, &d.DriverGetVersion, &d.cuInit} {
		if p.addr == addr {
			return p.name
		}
	}
	for _, s := range symbols() {
		if d.proc(s).addr == addr {
			return s.name
		}
	}
	return fmt.Sprintf("%#x", addr)
}

// ProcByName returns the resolved entry point with base name name (as
// listed by Missing), for FailEvery.
func (d *Driver) ProcByName(name string) (Proc, bool) {
	for _, s := range symbols() {
		if s.name == name {
			return *d.proc(s), d.proc(s).Found()
		}
	}
	return Proc{name: name}, false
}
