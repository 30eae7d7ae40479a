// Package loader opens shared libraries at run time and calls their C
// functions from Go without cgo. Package cuda reaches the NVIDIA driver
// through it; programs call it directly to use other CUDA libraries the
// purego way, for example cuBLAS, cuFFT, NCCL or nvrtc, in a binary built
// with CGO_ENABLED=0.
//
// [OpenCUDALibrary] opens a CUDA library by its short name ("cublas"),
// looking where CUDA installs put it ([LibraryCandidates] lists the
// places, in order; CUDAMEM_LIBRARY_PATH adds directories before them).
// [Library.Lookup] finds a function, and [Proc.Call] calls it with
// integer and pointer arguments and returns its result register:
//
//	lib, err := loader.OpenCUDALibrary("cublas")
//	if err != nil {
//		return err // a *LibraryError: every path tried, and why each failed
//	}
//	getProperty, err := lib.Lookup("cublasGetProperty")
//	if err != nil {
//		return err
//	}
//	var major int32
//	status := getProperty.Call(0, uintptr(unsafe.Pointer(&major))) // MAJOR_VERSION
//
// A library that is not found is a [*LibraryError] matching
// [ErrLibraryNotFound]; a nil, zero or closed Library refuses every call
// with [ErrInvalidArgument] or [ErrClosed]. Nothing here panics, and
// importing the package has no side effects.
//
// Functions that need a CUDA context current (most of cuBLAS's) are best
// bound with package cuda's Device.Foreign, which makes the device's
// context current inside each call.
//
// # Calls
//
// [Proc.Call] and [Proc.CallCtx] enter C through the runtime's cgocall path
// (the one cgo and purego use) with a small assembly trampoline on
// linux/amd64 and linux/arm64: no reflection, no variadic boxing and no heap
// allocation per call, so a call costs about what a cgo call costs.
// Windows uses syscall.SyscallN. A call passes at most [MaxArgs] integer
// arguments; an unresolved Proc returns [NotFound].
//
// Pointer arguments are passed as uintptr. Write the conversion
// uintptr(unsafe.Pointer(p)) directly in the argument list of Call: both
// Call and CallCtx are nosplit, so the goroutine stack cannot move between
// the conversion and the C call. Keep heap objects alive across the call
// with runtime.KeepAlive.
//
// C functions may call back into Go (purego.NewCallback) on the calling
// thread, as cgo allows. The callback runs on the calling goroutine's
// stack, which may then grow or be shrunk, and so move; Call finds its
// own record again afterwards (as cgo's generated code does), so the
// result arrives intact. The caller's pointers do not follow: a function
// that may call back into Go must be given heap (or C) memory, never the
// address of a variable on the goroutine stack.
//
// # The CUDA driver
//
// [Load] opens the driver once per process, safely from any goroutine: the
// path in the CUDAMEM_DRIVER environment variable if set (and nothing
// else); otherwise libcuda.so.1, libcuda.so and
// /usr/lib/wsl/lib/libcuda.so.1 (WSL) on Linux, nvcuda.dll on Windows,
// from the system directory only (a DLL of that name in the working
// directory or on PATH is never loaded). Other systems have no CUDA
// driver: Load reports that. A failed load returns a [*LoadError] listing
// every path tried and why each failed, and how to change the search.
//
// [Driver.Resolve] fills a caller's table of entry points, a struct of
// Proc fields named after them, through the driver's cuGetProcAddress at
// the ABI version the caller's calls are written against; package cuda
// keeps its table that way. [Proc.CallCtx] makes a CUDA context current
// on the very OS thread that runs the call, inside the same crossing into
// C, so callers never lock OS threads; [Driver.Bind] gives a function from
// another library the same path.
package loader
