package loader_test

import (
	"errors"
	"fmt"
	"log"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// Load the driver (once per process, from any goroutine) and report what
// it is. Most programs use package cuda, which loads it the same way.
func ExampleLoad() {
	d, err := loader.Load()
	var le *loader.LoadError
	if errors.As(err, &le) {
		for _, a := range le.Attempts {
			fmt.Printf("tried %s: %s\n", a.Path, a.Reason())
		}
		fmt.Println(le.Hint())
		return
	}
	if err != nil {
		log.Fatal(err) // *loader.InitError: the driver loaded but cuInit failed
	}
	found, total := d.Resolved()
	fmt.Printf("%s: CUDA %d.%d, %d of %d entry points\n", d.Path, d.Version/1000, d.Version%1000/10, found, total)
	if missing := d.Missing(); len(missing) > 0 {
		fmt.Println("calls to these report not supported:", missing)
	}
}

// Call an entry point directly: raw ABI values in, a raw CUresult out.
func ExampleProc_Call() {
	d, err := loader.Load()
	if err != nil {
		log.Fatal(err)
	}
	var n int32
	if r := d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))); r != 0 {
		log.Fatalf("cuDeviceGetCount: CUresult %d", int32(r)) // NotFound if unresolved
	}
	fmt.Println(n, "devices")
}

// Open a particular library: a tool or test that must not search. The
// error lists what was tried and why it failed.
func ExampleOpen() {
	_, err := loader.Open("/nonexistent/libcuda.so.1")
	var le *loader.LoadError
	if errors.As(err, &le) {
		fmt.Println(len(le.Attempts), "path tried:", le.Attempts[0].Path)
		fmt.Println(le.Hint())
	}
	// Output:
	// 1 path tried: /nonexistent/libcuda.so.1
	// set CUDAMEM_DRIVER to the driver library's path to choose it
}
