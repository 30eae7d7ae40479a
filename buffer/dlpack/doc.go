// Package dlpack hands cudamem buffers to C libraries loaded at run time,
// and takes memory from them, as DLPack tensors: the C ABI structs of
// dlpack.h (DLManagedTensorVersioned, and the older DLManagedTensor),
// which PyTorch, CuPy, JAX, TVM and many C and C++ libraries exchange.
// The package example hands a buffer out as a tensor and takes it back.
//
// # Export
//
// [Export] describes a [buffer.Buffer] as a DLManagedTensorVersioned
// ([ExportUnversioned]: a DLManagedTensor) and returns its address, to
// pass to the consumer (uintptr(unsafe.Pointer(t)) in a loader.Proc call).
// The tensor is what cuda.core's Buffer.__dlpack__ makes: 1-D, shape
// [size], no strides, byte offset 0, data at the buffer's address, on the
// device [DeviceOf] reads from the memory's accessibility (device-only
// memory: kDLCUDA and the device's ordinal; pinned and managed memory:
// kDLCUDAHost; host-only memory: kDLCPU). Its data type is uint8 (kDLUInt,
// 8 bits), where cuda.core says int8 (kDLInt): bytes are unsigned in Go,
// and a consumer viewing the tensor sees the values a []byte holds.
//
// The consumer owns the tensor until it calls the deleter, from any
// thread, a C thread the Go runtime never saw included. Until then the
// buffer's memory stays allocated (Export takes a [buffer.Buffer.Hold]):
// Close of the buffer returns nil and closes it for Go at once, and the
// deleter frees the memory, on the stream Close was given. Whichever of
// the two comes last frees, exactly once. A second deleter call, or one
// with an address that was never exported, does nothing ([StrayDeletes]
// counts them). [Live] counts the tensors whose deleter has not run.
//
// # Import
//
// [Import] ([ImportUnversioned]) takes a tensor from a C producer and
// returns a Buffer over its bytes (from data plus byte_offset, as many as
// its shape and data type span; dense layouts only), whose Close calls
// the producer's deleter exactly once. The Buffer's accessibility follows
// the tensor's device type; [ExpectDevice] refuses tensors on another
// device. Everything Import reads through the tensor's pointers is read
// through the kernel, never by a Go load, so a tensor with garbage fields
// is an error, not a crash. Host memory (kDLCPU) is checked page by page:
// every page readable, and writable unless the caller imports with
// [AllowReadOnly]; CUDA memory is checked with the driver, range by range.
// When Import fails, the tensor stays the caller's: its deleter has not
// been called ([Delete] calls it).
//
// # Systems
//
// Export hands out a C function pointer made with purego.NewCallback,
// and Import calls the producer's through the loader: both work on
// linux/amd64 and linux/arm64, with or without cgo (purego's runtime
// shim lets foreign threads call in without cgo). Elsewhere every call
// returns an error matching cuda.ErrNotSupported; the struct types build
// everywhere, laid out as the target's C ABI lays them out.
//
// # Threads and contexts
//
// The deleter does its work (a free through the driver, when the Buffer
// was closed first) on a Go thread and waits for it, so the calling
// thread's current CUDA context is not changed. It must not be called
// from a CUDA host function (cuLaunchHostFunc). It may be called from
// inside a C function that Go called, from many goroutines at once, with
// or without cgo or the race detector. For imports, CloseOn(stream) waits
// for the stream before calling the producer's deleter.
package dlpack
