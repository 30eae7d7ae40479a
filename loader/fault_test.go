//go:build cudamemfault && linux && (amd64 || arm64)

package loader

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/internal/faultinject"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFaultFailCallOneShot(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	t.Cleanup(faultinject.Reset)

	faultinject.FailCall(2, 2) // CUDA_ERROR_OUT_OF_MEMORY on the second call
	var n int32
	assert.Equal(t, uintptr(0), d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))), "call 1 reaches the driver")
	assert.Equal(t, int32(3), n)
	n = -1
	assert.Equal(t, uintptr(2), d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))), "call 2 is failed")
	assert.Equal(t, int32(-1), n, "a failed call must not reach the driver")
	assert.Equal(t, uintptr(0), d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))), "one-shot: call 3 reaches the driver")
	assert.Equal(t, int32(3), n)
	assert.Equal(t, int64(3), faultinject.Calls())
	fired, addr := faultinject.Fired()
	assert.Equal(t, int64(1), fired)
	assert.Equal(t, d.DeviceGetCount.Addr(), addr)
	assert.Equal(t, "cuDeviceGetCount", faultinject.ProcName(addr))
	assert.False(t, faultinject.Armed())
}

func TestFaultCountsContextCallsAndSkipsTheDriver(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	t.Cleanup(faultinject.Reset)

	var got uintptr
	require.Equal(t, uintptr(0), d.CtxGetCurrent.CallCtx(0x1111, uintptr(unsafe.Pointer(&got))))
	require.Equal(t, uintptr(0x1111), got)

	faultinject.FailCall(1, 201)
	got = 0
	r := d.CtxGetCurrent.CallCtx(0x2222, uintptr(unsafe.Pointer(&got)))
	assert.Equal(t, int32(201), int32(r))
	assert.NotEqual(t, NotFound, r, "an injected result is never NotFound")
	assert.Equal(t, uintptr(0), got, "the entry point was not called")
	// Nor was cuCtxSetCurrent: the context is still the one set before.
	require.Equal(t, uintptr(0), d.CtxGetCurrent.Call(uintptr(unsafe.Pointer(&got))))
	assert.Equal(t, uintptr(0x1111), got, "the failed call must not have switched the context")
	assert.Equal(t, int64(2), faultinject.Calls(), "CallCtx and Call each count once")

	// A negative CUresult survives the trip as its low 32 bits.
	faultinject.FailCall(1, -7)
	assert.Equal(t, int32(-7), int32(d.CtxGetCurrent.Call(uintptr(unsafe.Pointer(&got)))))
}

func TestFaultUnresolvedAndBadCallsAreNotCounted(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	t.Cleanup(faultinject.Reset)
	faultinject.FailCall(1, 2)
	assert.Equal(t, NotFound, d.MemGetInfo.Call(0, 0), "unresolved: NotFound, not the injected result")
	assert.Equal(t, NotFound, d.LaunchKernel.Call(make([]uintptr, MaxArgs+1)...))
	assert.Equal(t, int64(0), faultinject.Calls())
	assert.True(t, faultinject.Armed(), "still waiting for a real driver call")
	var n int32
	assert.Equal(t, uintptr(2), d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))))
}

func TestFaultFailEvery(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	t.Cleanup(faultinject.Reset)
	faultinject.FailEvery(d.DeviceGetCount.Addr(), 999)
	var n int32
	var c uintptr
	for i := 0; i < 3; i++ {
		assert.Equal(t, uintptr(999), d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))))
		assert.Equal(t, uintptr(0), d.CtxGetCurrent.Call(uintptr(unsafe.Pointer(&c))), "other entry points still work")
	}
	fired, addr := faultinject.Fired()
	assert.Equal(t, int64(3), fired)
	assert.Equal(t, "cuDeviceGetCount", faultinject.ProcName(addr))
	faultinject.Reset()
	assert.Equal(t, uintptr(0), d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))))
	assert.Equal(t, int32(3), n)
	assert.Equal(t, "cuInit", faultinject.ProcName(d.cuInit.Addr()))
	assert.Equal(t, "0x1", faultinject.ProcName(1))
	assert.Equal(t, "", faultinject.ProcName(0))
}

// The trace names each call by the entry point the loader resolved at its
// address, whichever table or bootstrap step resolved it.
func TestFaultTraceNamesCalls(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	t.Cleanup(faultinject.Reset)
	var n int32
	var c uintptr
	faultinject.TraceStart()
	d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n)))
	d.CtxGetCurrent.CallCtx(0x1111, uintptr(unsafe.Pointer(&c)))
	d.DriverGetVersion.Call(uintptr(unsafe.Pointer(&n)))
	d.MemGetInfo.Call(0, 0) // unresolved: never reaches the hook
	assert.Equal(t, []string{"cuDeviceGetCount", "cuCtxGetCurrent", "cuDriverGetVersion"}, faultinject.TraceStop())
	d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n)))
	faultinject.TraceStart()
	assert.Empty(t, faultinject.TraceStop(), "calls between traces are not recorded")
}

func TestFaultOneShotUnderConcurrency(t *testing.T) {
	// Exactly one of many racing calls is failed.
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	t.Cleanup(faultinject.Reset)
	faultinject.FailCall(500, 2)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				var n int32
				if d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))) != 0 {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, failed)
	assert.Equal(t, int64(1600), faultinject.Calls())
}

func TestFaultPathAllocatesNothingAndKeepsStackWrites(t *testing.T) {
	memset := lookup(t, libc(t), "memset")
	t.Cleanup(faultinject.Reset)
	faultinject.FailCall(1<<40, 2) // armed, never reached: every call takes the counting path
	var x uint64
	allocs := testing.AllocsPerRun(1000, func() { memset.Call(uintptr(unsafe.Pointer(&x)), 0, 8) })
	assert.Zero(t, allocs)
	// Pointer arguments into the stack stay valid with the hook in the
	// path, at many stack depths (the hook must not grow the stack).
	for depth := 0; depth < 200; depth++ {
		done := make(chan struct{})
		go func() { defer close(done); deepWrite(t, memset, depth, depth) }()
		<-done
	}
}

func BenchmarkCallLabsFaultHook(b *testing.B) {
	labs := lookup(b, libc(b), "labs")
	faultinject.Reset()
	b.ReportAllocs()
	for b.Loop() {
		labs.Call(7)
	}
}
