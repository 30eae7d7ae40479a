//go:build linux && (amd64 || arm64)

package loader

import (
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// A C function that calls back into Go runs the callback on the calling
// goroutine's stack, below the frame of Call, and the callback may grow
// that stack (or the garbage collector may shrink it while the callback
// blocks): the runtime then copies the stack elsewhere and frees the old
// one. The call's record (arguments and result) lives in Call's frame, so
// the trampoline must find it again after C returns, as cgo's generated
// code does, instead of writing the result through the address it had
// before the call: that write lands in freed stack memory and the result
// the caller reads is lost.

var (
	growOnce     sync.Once
	growCallback uintptr // int compar(const void *, const void *) for bsearch
	growDepth    int     // frames of growBy the callback runs
)

// growBy uses about n KiB of goroutine stack (and returns a byte of it, so
// that the frames are not optimized away).
//
//go:noinline
func growBy(n int) byte {
	var pad [1024]byte
	pad[n%1024] = byte(n)
	if n > 0 {
		return growBy(n-1) + pad[(n*7)%1024]
	}
	return pad[0]
}

func bsearchCallback() uintptr {
	growOnce.Do(func() {
		growCallback = purego.NewCallback(func(key, elem uintptr) uintptr {
			_ = growBy(growDepth)
			return 0 // equal: bsearch returns the element
		})
	})
	return growCallback
}

// TestCallResultSurvivesCallbackStackMove calls libc's bsearch with a
// comparison callback that grows the goroutine stack by 64 KiB: the stack
// moves while bsearch runs, and Call must still return the element's
// address (it returned 0, the result's old value, before the trampoline
// found the moved record).
func TestCallResultSurvivesCallbackStackMove(t *testing.T) {
	bsearch := lookup(t, libc(t), "bsearch")
	cb := bsearchCallback()
	growDepth = 64
	elems := new([4]uint64) // heap: C reads it while the stack moves
	key := new(uint64)
	for i := range 200 {
		done := make(chan uintptr)
		go func() { // a fresh goroutine: a small stack that must grow
			done <- bsearch.Call(uintptr(unsafe.Pointer(key)), uintptr(unsafe.Pointer(&elems[0])), 1, 8, cb)
		}()
		if got, want := <-done, uintptr(unsafe.Pointer(&elems[0])); got != want {
			t.Fatalf("call %d: bsearch returned %#x after its callback moved the stack, want %#x", i, got, want)
		}
	}
	runtime.KeepAlive(elems)
	runtime.KeepAlive(key)
}
