// Package loader finds and opens the NVIDIA CUDA driver library at run time
// and calls into it without cgo.
//
// It is the lowest layer of cudamem and knows nothing of CUDA's meaning: it
// speaks raw ABI values (uintptr, 64-bit integers, pointers to caller
// memory). Package cuda gives those values types, errors and contexts; use
// that package unless you are adding an entry point.
//
// # Search order
//
// [Load] opens the first of [SearchPaths] that loads: the path in the
// CUDAMEM_DRIVER environment variable if set (and nothing else); otherwise
// libcuda.so.1, libcuda.so and /usr/lib/wsl/lib/libcuda.so.1 (WSL) on Linux,
// nvcuda.dll on Windows, from the system directory only (a DLL of that name
// in the working directory or on PATH is never loaded). Other systems have
// no CUDA driver: Load reports that. A failed load returns a [*LoadError]
// listing every path tried and why each failed, and how to change the
// search.
//
// # Entry points
//
// Only cuGetProcAddress (v2, then v1), cuDriverGetVersion and cuInit are
// looked up with dlsym. Every other entry point is resolved by base name
// through cuGetProcAddress at the ABI version our Go calls match, so a
// newer driver keeps serving the signature we were written against. An
// entry point the driver lacks (or only offers with a different ABI) is left
// unresolved: calling it returns [NotFound] and package cuda reports
// cuda.ErrNotSupported. Nothing here panics and importing the package has no
// side effects; loading happens once, on first use, safely from any
// goroutine.
//
// # Calls
//
// [Proc.Call] and [Proc.CallCtx] enter C through the runtime's cgocall path
// (the one cgo and purego use) with a small assembly trampoline on
// linux/amd64 and linux/arm64: no reflection, no variadic boxing and no heap
// allocation per call, so a call costs about what a cgo call costs. CallCtx
// also makes a CUDA context current on the very OS thread that runs the
// call, inside the same crossing, so callers never lock OS threads.
// Windows uses syscall.SyscallN.
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
// # Fault injection
//
// Built with -tags cudamemfault, the loader can make the k-th driver call
// fail with a chosen CUresult without calling the driver ([FailCall],
// [FailEvery], [FaultCalls], [FaultReset]): the project's fault sweeps use it
// to run every public operation with each of its driver calls failing in turn.
// In normal builds the hook is a constant false and compiles away; the
// call path is unchanged ([FaultInjection] reports which build this is).
package loader
