// Package cuda is the typed layer over the NVIDIA CUDA driver: devices,
// contexts, streams, events, graphs, errors, and the driver's memory, pool
// and copy calls. It loads the driver at run time (package loader), so a
// program that uses it builds with CGO_ENABLED=0 and needs no CUDA
// toolkit, and any goroutine may call any method without
// runtime.LockOSThread.
//
// Most programs take devices and streams from here and their memory from
// the packages above: buffer (Buffer and the MemoryResource interface),
// resource (pools, pinned, managed and synchronous memory), ipc and
// virtual. This package's own memory calls manage no lifetimes. The
// package example finds the GPUs and tells a machine without a driver
// from a failure.
//
// # Loading
//
// The driver is loaded on first use, once per process (see package loader
// for the search order and the CUDAMEM_DRIVER override). Without a driver,
// calls return an error matching [ErrNoDriver] that lists every path tried.
// Entry points an older driver lacks report [ErrNotSupported]. Where a
// feature has a fallback, the choice is made at load, not by trying the
// call: [Stream.MemcpyBatchAsync] uses the driver's batched copy where it
// has one and a loop of copies elsewhere ([Device.MemcpyBatchPath] says
// which).
//
// # Contexts and goroutines
//
// The CUDA "current context" belongs to an OS thread, and goroutines move
// between threads. cudamem never relies on it: every call that needs a
// context makes its device's primary context current on the thread that
// performs the driver call, inside the same crossing into C. Primary
// contexts are retained on first use and kept for the life of the process.
//
// Other CUDA libraries (cuBLAS, cuFFT, NCCL) use the context current on
// the calling thread instead: [Device.Do] runs Go code on a locked OS
// thread with it current, [Device.Foreign] binds a C function of another
// library so that each [ForeignFunc.Call] makes it current inside its own
// crossing into C, and [Device.WrapStream] borrows a stream another
// library created.
//
// # Other contexts
//
// A *Device is a view of one GPU through one context. [WrapContext] adopts
// a CUcontext made elsewhere (another library, a framework, cuCtxCreate)
// and [Device.NewContext] creates one cudamem owns ([Context], destroyed
// by Close); both give a *Device that every constructor accepts, so
// streams, events, modules, resources and buffers made from it run with
// that context current. Views compare by pointer, one per context; objects
// that CUDA ties to a context (streams, events, modules, cuMemAlloc
// memory) belong to one view, while pools and virtual memory belong to the
// GPU ([Device.SameGPU]). cudamem never destroys a context it did not
// create, and never leaves one pushed on a thread. See [Context] for the
// rules and lifetimes. Green contexts (a partition of the GPU's SMs) are
// made with [Device.NewGreenContext] and adopted with [WrapGreenContext].
//
// # Streams
//
// A nil *Stream is rejected here; higher layers map a nil stream to the
// device's legacy default stream ([Device.DefaultStream], handle 0). The
// per-thread default stream is never used, because goroutines are not
// threads.
//
// # Stream capture and graphs
//
// [Stream.BeginCapture] records the work submitted to a stream into a
// graph instead of running it, [Stream.EndCapture] returns it as a
// [*Graph], and [Graph.Instantiate] makes a [*GraphExec] to launch many
// times. Capture is relaxed by default, since goroutines are not threads
// (see [CaptureMode]). Operations that cannot be captured (host waits,
// non-stream-ordered allocations) are refused on a capturing stream with
// an error matching [ErrCapturing] rather than left to invalidate the
// capture ([Stream.RefuseCapture]); graph memory counters and trimming
// are methods of [Device].
//
// # Errors
//
// Driver failures are [*OpError] values naming the entry point and wrapping
// a [Result]; match them with errors.Is:
//
//	if errors.Is(err, cuda.ErrorOutOfMemory) { ... }
//
// Go-side validation failures wrap [ErrInvalidArgument]; use after Close
// wraps [ErrClosed]; a missing driver matches [ErrNoDriver]. A Success
// result is never returned as an error.
//
// # Fabric handles
//
// Multi-node NVLink systems share memory between nodes with fabric
// handles (brokered by the IMEX service): [Device.MemExportFabric] and
// [Device.MemImportFabric] for VMM allocations, [MemPool.ExportFabric] and
// [Device.ImportMemPoolFabric] for pools. A [MemFabricHandle] is 64 plain
// bytes whose String shows a fingerprint only. Without IMEX the errors
// match [ErrNotSupported] ([FabricError]); [Device.CheckFabric] probes it
// up front.
//
// # Process checkpoints
//
// [CheckpointProcessLock], [CheckpointProcessCheckpoint],
// [CheckpointProcessRestore], [CheckpointProcessUnlock],
// [CheckpointProcessGetState] and [CheckpointProcessGetRestoreThreadID]
// are the driver's checkpoint calls on another process (CUDA 12.8,
// Linux); package cuda/checkpoint is the API built on them.
//
// # Lifetimes
//
// Streams, events and modules are closed explicitly with Close, which is
// idempotent; any other use afterwards returns an error matching
// ErrClosed. Accessors that hand out a raw driver value never hand out a
// dead one: [Stream.Handle] and [Event.Handle] return 0 once closed, and
// their Err forms ([Stream.HandleErr], [Event.HandleErr]) say why. A value
// handed out is valid only while its object stays open. The calls that
// take a raw handle ([WrapContext], [WrapGreenContext],
// [Device.WrapStream]) refuse the handles of objects cudamem destroyed
// itself; see each for what that covers.
//
// # Nil and zero values
//
// As with *os.File, every method of every type here is safe on a nil
// pointer and on a zero value (a Device{} not from GetDevice, a Stream{}
// not from NewStream, a zero MemPool, ...): it returns an error matching
// [ErrInvalidArgument] (or ErrClosed), or a zero value, before any driver
// call, and Close on one does nothing. Arguments the driver would take as
// NULL or 0 are refused the same way, and numbers the driver returns that
// callers use as lengths, indexes or alignments are checked: an impossible
// value, or a zero handle from a create the driver reports as successful,
// is an error matching [ErrorUnknown], never a panic.
package cuda
