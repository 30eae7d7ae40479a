package cuda

import (
	"os"
	"testing"
	"unsafe"
)

// BenchmarkCallCost splits a context-needing call into its parts: the
// bare crossing, cuCtxGetCurrent, cuCtxSetCurrent, and a call through the
// context-setting path (which sets the context on every call).
func BenchmarkCallCost(b *testing.B) {
	ds, err := devices()
	if err != nil || len(ds) == 0 {
		if os.Getenv("CUDAMEM_REQUIRE_GPU") == "1" {
			b.Fatalf("GPU required: %v", err)
		}
		b.Skip("no GPU")
	}
	d := ds[0]
	ctx, err := d.context()
	if err != nil {
		b.Fatal(err)
	}
	var v int32
	var c uintptr
	b.Run("version", func(b *testing.B) {
		for b.Loop() {
			d.drv.DriverGetVersion.Call(uintptr(unsafe.Pointer(&v)))
		}
	})
	b.Run("version-ctx", func(b *testing.B) {
		for b.Loop() {
			d.drv.DriverGetVersion.CallCtx(ctx, uintptr(unsafe.Pointer(&v)))
		}
	})
	b.Run("get-current", func(b *testing.B) {
		for b.Loop() {
			d.drv.CtxGetCurrent.Call(uintptr(unsafe.Pointer(&c)))
		}
	})
	b.Run("set-current", func(b *testing.B) {
		for b.Loop() {
			d.drv.CtxSetCurrent.Call(ctx)
		}
	})
}
