//go:build !cudamemfault

package loader

// faultEnabled is false in normal builds: the fault-injection branch in the
// call path is compiled away (build with -tags cudamemfault for
// internal/faultinject).
const faultEnabled = false

// faultHit is never called in normal builds; it exists so the call path
// compiles the same way with and without the tag.
//
//go:nosplit
//go:norace
func faultHit(fn uintptr) (uintptr, bool) { return 0, false }

func faultNote(uintptr, string) {}
