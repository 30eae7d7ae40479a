// Package buffer holds [Buffer], a range of memory a CUDA device or the
// host can use, with its copies (to and from Go slices, between buffers,
// batched), fills and slices, and the [MemoryResource] interface that
// hands buffers out. It is the Go counterpart of cuda.core's Buffer and
// MemoryResource; the resources themselves (device pools, pinned, managed,
// synchronous, and adaptors) live in package resource. The package
// example copies data to the device, between two buffers and back.
//
// # Buffers and ownership
//
// A Buffer is an address, a size, and, when owned, the resource that frees
// it. There are three kinds:
//
//   - Owned buffers come from a resource's Allocate (or from [Owned], which
//     resources use to build them). Close gives the memory back through
//     [MemoryResource.Deallocate].
//   - Borrowed buffers wrap memory owned elsewhere ([FromPointer]). Close
//     only ends their use; where the memory lives is asked of the driver.
//   - Views ([Buffer.Slice]) are ranges of another buffer. They never free,
//     keep their owner from being garbage collected, and end when the owner
//     (or a view they were sliced from) is closed.
//
// [Buffer.Close] and [Buffer.CloseOn] are idempotent. Every other method of
// a closed buffer returns an error matching [cuda.ErrClosed];
// [Buffer.Ptr] then returns 0, [Buffer.Resource] nil, and the
// accessibility accessors report memory reachable from nowhere.
// [Buffer.PtrErr] returns the address or the error that says why there is
// none, for code that must not pass a silent 0 on (the same convention as
// cuda.Stream.HandleErr and the pools' PoolErr).
//
// Resources hand out memory; one place builds Buffers. A
// [MemoryResource] deals in addresses (AllocatePtr, Deallocate), and
// [Allocate] asks it for one and wraps it in a Buffer it owns; each
// concrete resource's Allocate method is a call of it. Layers that pass
// memory through to another resource (adaptors, sub-allocators) forward
// addresses only, so a stack of layers builds one Buffer per allocation,
// at the top, as RMM's adaptors forward a pointer. [Owned] wraps memory a
// resource mapped rather than allocated (imports).
//
// # Streams
//
// Copies and fills are ordered on a stream and asynchronous unless their
// documentation says otherwise: they start after the work already submitted
// to the stream, and the CPU must synchronize the stream before it reads
// what they wrote. A nil stream argument means the buffer's allocation
// stream ([Buffer.Stream]) if it has one, else the legacy default stream
// of the buffer's device ([cuda.Device.DefaultStream]), or of device 0 for
// memory bound to no device (pinned host memory). For copies between two
// buffers it is the stream of the receiver. The per-thread default stream
// is never used, because goroutines are not threads.
//
// Close frees on the allocation stream; when the memory was last used on
// another stream, free it there with CloseOn, or make the allocation
// stream wait for that one first ([cuda.Stream.WaitStream]).
//
// # Foreign code
//
// Memory handed to other libraries (cuBLAS, a kernel, PyTorch through
// DLPack) is used outside cudamem's view. Two rules keep it sound:
//
//   - For the host-side call, hold the buffers open: [Buffer.Use] for one,
//     the package function [Use] for several at once. Close waits for them;
//     neither ever waits for a lock, so they cannot deadlock against Close
//     in any order, and a call that starts while a Close is under way fails
//     with cuda.ErrClosed.
//   - For work the foreign code queued asynchronously, order the free after
//     it: [Buffer.CloseAfter] with the streams it used (wrap a foreign
//     stream handle with cuda.Device.WrapStream), or CloseOn when it used
//     one stream, or synchronize those streams before Close. cudamem cannot
//     see work it did not submit, and nothing else ties a buffer's life to
//     it.
//   - For memory the foreign code keeps after the call returns (a DLPack
//     consumer, which gives it back through a deleter when it likes), take
//     a [Buffer.Hold]: Close then closes the Buffer for Go but leaves the
//     free to the Hold's Release, so the memory outlives whichever of the
//     two comes last. Package dlpack does this for its exports.
//
// # Copies
//
// [Buffer.CopyTo], [Buffer.CopyFrom] and [Buffer.Clone] copy between
// buffers of equal size, on one device, between host and device, or
// between two devices (cuMemcpyPeerAsync). [CopyFromHost] and [CopyToHost]
// copy between a buffer and a Go slice of plain data ([]float32, []uint16,
// arrays and structs of numbers; never types that hold Go pointers).
// [Buffer.ReadAt] and [Buffer.WriteAt] make a buffer an [io.ReaderAt] and
// an [io.WriterAt]. Sizes must match exactly; slice a buffer to copy part
// of it. A size mismatch is an error matching [cuda.ErrInvalidArgument]
// that names both sizes.
//
// [CopyBatch] submits many copies between ranges of buffers as one batch
// (cuMemcpyBatchAsync where the driver has it), checked whole, every
// buffer held open, before anything is submitted.
//
// Go slices live in pageable memory, which the DMA engines cannot read
// directly. Copies of 4 MiB or more from a Go slice into device memory,
// and of 16 MiB or more back, are staged through a small pool of pinned
// host memory (32 MiB, allocated on first use and kept for the life of
// the process): up to 8 goroutines (no more than GOMAXPROCS) move the
// data between the slice and the pool while the DMA engine moves the
// pieces before, several times faster than the driver's own staging for
// large copies (BENCHMARKS.md has figures).
// A copy into a slice whose pages the kernel has not mapped yet (a slice
// just made) is staged from 256 KiB, and maps the pages while the DMA of
// each piece still runs, with up to 16 goroutines: there the kernel's
// work of mapping every page bounds the copy, and it grows with the
// goroutines that share it.
// Smaller copies, and copies made while another one uses the pool, go
// through the driver. Copies to and from pinned host buffers need no
// staging: they are plain memory moves, and so are copies to and from
// memory no device can reach (a resource whose DeviceAccessible is false
// and HostAccessible true), which need no stream either.
//
// A failed copy does not change how later ones run, and failures neither
// leak pinned memory nor let a transfer overwrite it.
//
// # Host views
//
// [Buffer.Bytes] returns host-accessible memory (pinned or managed) as a
// []byte without copying. The slice is not tracked: it is invalid once the
// buffer is closed, and the streams that write the memory must be
// synchronized before it is read. It does not keep the buffer alive
// either; so that code without unsafe can never reach freed memory through
// it, the safety net below never frees an allocation whose Bytes were
// taken (see [LeaksKept]).
//
// # Lifetimes and leaks
//
// Close every owned buffer. A Buffer that becomes unreachable without
// Close is freed by the garbage collector's safety net on its allocation
// stream and counted by [Leaks]; tests can assert the count stays zero. Do
// not rely on it: the garbage collector may run late or never, and device
// memory is invisible to it, so a program can run out of device memory
// long before the collector sees a reason to run, and the net frees a
// lost buffer only once the buffers made around it are lost too (see
// [Leaks]). A lost buffer whose memory a host view may still reach
// ([Buffer.Bytes]), or whose resource refuses to free it, is not freed:
// it stays allocated, counted by [Leaks] and [LeaksKept].
//
// # Concurrency
//
// A Buffer is safe for concurrent use. Close waits for the methods in
// progress on the buffer (not for the device work they submitted: that
// is what stream ordering is for), and a MemoryResource must be safe for
// concurrent use. No method waits for another: a call that starts while a
// Close is in progress fails at once with an error matching
// [cuda.ErrClosed] (even if that Close then fails), so calls that use
// several buffers at once (copies, a [Buffer.Use] whose function uses
// other buffers) cannot deadlock with Closes, in any order. Only Close
// and Disown wait, for the calls in progress; so a function run by Use
// must not close the buffer it was given. Device memory itself is not
// synchronized: two streams writing the same bytes race, as in CUDA.
//
// # Nil and zero values
//
// Every method of a nil *Buffer, of a zero Buffer, and of a closed one
// returns an error matching [cuda.ErrInvalidArgument] or
// [cuda.ErrClosed], or a zero value (Close returns nil); so does every
// method given a zero [cuda.Stream] (new(cuda.Stream): it belongs to no
// device) or a range no memory can have. None of them panics.
package buffer
