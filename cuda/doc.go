// Package cuda is cudamem's typed layer over the CUDA driver: results and
// errors, devices, primary contexts, streams, events, and the driver's
// memory, pool and copy calls. It loads the driver at run time (package
// loader) and needs neither cgo nor the CUDA toolkit to build.
//
// Higher packages build on it: buffer (Buffer and the MemoryResource
// interface), resource (pools, pinned, managed and synchronous resources),
// ipc and virtual. Use those for owned memory; this package's memory calls
// manage no lifetimes.
//
// # Loading
//
// The driver is loaded on first use, once per process (see package loader
// for the search order and the CUDAMEM_DRIVER override). Without a driver,
// calls return an error matching [ErrNoDriver] that lists every path tried.
// Entry points an older driver lacks report [ErrNotSupported]. Where a
// feature has a fallback, the choice is made at load, not by trying the
// call: [Stream.MemcpyBatchAsync] uses cuMemcpyBatchAsync_v2 (CUDA 13.0),
// its CUDA 12.8 ABI, or a loop of cuMemcpyAsync, whichever the driver
// offers first ([Device.MemcpyBatchPath]).
//
// # Contexts and goroutines
//
// The CUDA "current context" belongs to an OS thread, and goroutines move
// between threads. cudamem never relies on it: every call that needs a
// context makes its device's primary context current on the thread that
// performs the driver call, inside the same crossing into C. Callers never
// need runtime.LockOSThread, and any goroutine may use any device. Primary
// contexts are retained on first use and kept for the life of the process.
//
// Other CUDA libraries (cuBLAS, cuFFT, NCCL) use the context current on
// the calling thread instead. [Device.Do] runs Go code on a locked OS
// thread with a device's primary context current and restores the
// thread's previous context afterwards; [Device.Foreign] binds a C
// function of another library (opened with loader.OpenCUDALibrary) so that
// each [ForeignFunc.Call] makes the context current inside its own
// crossing into C, as cudamem's driver calls do. [Device.WrapStream] turns
// a stream another library created into a borrowed Stream, after checking
// that it belongs to the Device's context.
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
// wraps [ErrClosed]. A Success result is never returned as an error.
//
// # Fabric handles
//
// Multi-node NVLink systems (GB200 NVL72 and later) share memory between
// nodes with fabric handles (CU_MEM_HANDLE_TYPE_FABRIC, brokered by the
// IMEX service): [Device.MemExportFabric] and [Device.MemImportFabric]
// for VMM allocations, [MemPool.ExportFabric] and
// [Device.ImportMemPoolFabric] for pools. A [MemFabricHandle] is 64 plain
// bytes (MarshalBinary, UnmarshalBinary; its String shows a fingerprint,
// not the bytes, which are a capability). Where IMEX is absent the driver
// refuses fabric memory with CUDA_ERROR_NOT_PERMITTED or
// CUDA_ERROR_NOT_SUPPORTED; [FabricError] turns that into an error that
// matches [ErrNotSupported], still matches the driver's Result, and says
// what is needed ([FabricRequirements]). [Device.CheckFabric] probes it up
// front, as NCCL does, and [Device.CheckFabricAt] for memory at another
// location (host, host NUMA node). [Device.CreateMemPool] runs that probe
// at the pool's location before it makes a pool with fabric handles:
// without IMEX the driver can make such a pool, refuse its export, and
// crash the process when it is destroyed.
//
// # Lifetimes
//
// Streams, events and modules are closed explicitly with Close, which is
// idempotent; any other use afterwards returns an error matching ErrClosed.
//
// Accessors that hand out a raw driver value never hand out a dead one:
// [Stream.Handle] and [Event.Handle] return 0 once closed (as
// buffer.Buffer.Ptr and the pools' Pool methods return zero values), and
// their Err forms ([Stream.HandleErr], [Event.HandleErr]) say why with an
// error matching ErrClosed (or ErrInvalidArgument for nil and zero
// values). Use the Err form where 0 could be mistaken for a real value
// (the legacy default stream's handle is 0). A value handed out is valid
// only while its object stays open: closing it while foreign code still
// uses the value is a program error cudamem cannot see.
//
// The driver does not validate a destroyed object's handle: handing one
// back to it can crash the process. cudamem keeps a record of the
// contexts, green contexts and streams it destroyed itself, and the calls
// that take a raw handle ([WrapContext], [WrapGreenContext],
// [Device.WrapStream]) refuse those without a driver call, with an error
// matching [ErrInvalidArgument] and the driver's Result for a stale
// handle. A handle destroyed by other code cannot be recognised and
// reaches the driver; a context or stream another library creates at the
// address of one cudamem destroyed (the driver reuses addresses) is
// refused as destroyed. Objects made through a view whose context
// [Context.Close] destroyed (streams, modules, kernels, foreign
// functions) refuse every call with [ErrClosed] before the driver, and
// their Close (graphs, events and modules included) makes no driver call
// either: it marks them closed, returning nil, or for a green context,
// whose objects CUDA leaks, an error matching [ErrClosed] that says so
// (see [Device.NewGreenContext]).
//
// # Nil and zero values
//
// As with *os.File, every method of every type here is safe on a nil
// pointer and on a zero value (a Device{} not from GetDevice, a Stream{}
// not from NewStream, a zero MemPool, ...): it returns an error matching
// [ErrInvalidArgument] (or ErrClosed), or a zero value, before any driver
// call, and Close on one does nothing. Arguments the driver would take as
// NULL or 0 (nil host pointers with a non-zero size, zero allocation sizes,
// nil property structs, zero pools, zero physical allocation handles) are
// refused the same way. Numbers the driver returns that callers use as
// lengths, indexes or alignments (the device count, allocation
// granularity, exported fds, NUMA nodes) are checked: an impossible value
// is an error matching [ErrorUnknown], never a panic. So is a zero handle
// from a create or import the driver reports as successful (streams,
// events, modules, graph execs, green contexts, physical allocations,
// fabric imports): a zero handle is never handed out as a live one. TestNilAndZeroHandles sweeps every exported method by
// reflection to keep it so.
package cuda
