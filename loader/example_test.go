package loader_test

import (
	"errors"
	"fmt"
	"log"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// Call a cuBLAS function without cgo: open the library by its short name,
// look the function up and call it with raw C values. cublasGetProperty
// needs no GPU, handle or context.
func ExampleOpenCUDALibrary() {
	lib, err := loader.OpenCUDALibrary("cublas")
	if err != nil {
		log.Fatal(err) // every path tried, and why each failed
	}
	getProperty, err := lib.Lookup("cublasGetProperty")
	if err != nil {
		log.Fatal(err)
	}
	var major, minor int32
	// libraryPropertyType: 0 is MAJOR_VERSION, 1 MINOR_VERSION. The result
	// is a C enum: only its low 32 bits mean anything.
	if r := getProperty.Call(0, uintptr(unsafe.Pointer(&major))); uint32(r) != 0 {
		log.Fatalf("cublasGetProperty: status %d", int32(r))
	}
	getProperty.Call(1, uintptr(unsafe.Pointer(&minor)))
	fmt.Printf("cuBLAS %d.%d from %s\n", major, minor, lib.Path())
}

// A library that is not installed: the error matches ErrLibraryNotFound
// and lists each place tried (LibraryCandidates lists them beforehand).
func ExampleOpenCUDALibrary_notFound() {
	_, err := loader.OpenCUDALibrary("cudamem-example-absent")
	fmt.Println(errors.Is(err, loader.ErrLibraryNotFound))
	var le *loader.LibraryError
	if errors.As(err, &le) {
		fmt.Println(le.Name, len(le.Attempts) == len(loader.LibraryCandidates(le.Name)))
	}
	// Output:
	// true
	// cudamem-example-absent true
}

// Resolve a table of driver entry points, as package cuda does: each Proc
// field is the entry point "cu" and its name; tags choose the ABI.
func ExampleDriver_Resolve() {
	d, err := loader.Load()
	var le *loader.LoadError
	if errors.As(err, &le) {
		fmt.Println(le.Hint())
		return
	}
	if err != nil {
		log.Fatal(err) // *loader.InitError: the driver loaded but cuInit failed
	}
	var drv struct {
		DeviceGetCount loader.Proc
		MemGetInfo     loader.Proc `dlsym:"cuMemGetInfo_v2"`
	}
	missing, err := d.Resolve(&drv)
	if err != nil {
		log.Fatal(err)
	}
	var n int32
	if r := drv.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))); r != 0 {
		log.Fatalf("cuDeviceGetCount: CUresult %d", int32(r))
	}
	fmt.Printf("CUDA %d.%d at %s: %d devices; missing %v\n", d.Version/1000, d.Version%1000/10, d.Path, n, missing)
}

// Open a particular driver library: a tool or test that must not search.
// The error lists what was tried and why it failed.
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
