// Package virtual allocates GPU memory through CUDA's virtual memory
// management (VMM): physical chunks (cuMemCreate) mapped into reserved
// address ranges. Its Resource is a buffer.MemoryResource whose
// allocations can grow without copying, shrink, change peer access, and be
// exported to other processes as file descriptors, or to other nodes of a
// multi-node NVLink domain as fabric handles; NCCLOptions makes buffers
// NCCL can register. The package example grows an allocation in place and
// checks that its data stayed.
//
// # Growing
//
// Resource.Grow extends an allocation by mapping one new physical chunk:
//
//   - inside the allocation's own reservation, when Options.Reserve left
//     room (the pointer does not change);
//   - else right after it, when the driver grants the adjacent address
//     range (the pointer does not change);
//   - else by mapping the existing chunks, unchanged, into a new larger
//     range and unmapping the old one (the pointer changes; no byte is
//     copied).
//
// The cost grows with the added size (one cuMemCreate, map and set-access)
// plus, on the last path only, one map per existing chunk (access is set
// on the new range, and the old range unmapped, in one call each). An
// allocation starts as one physical chunk of its size rounded up to the
// granularity, whatever its size: only grows add chunks. Data written
// before a grow is intact after it. Every physical handle is released when
// the allocation is freed or shrunk, and a failed grow leaves the original
// allocation as it was.
//
// # A pool that follows live memory
//
// NewPool returns a resource.SubAllocator whose blocks are chunks of this
// package's memory, mapped when allocations need them and unmapped as
// soon as their last allocation is freed (see resource.ReleasePolicy), so
// that the memory mapped follows the memory in use instead of what a
// cache once held.
//
// # Beyond one node: fabric handles
//
// Options.HandleType HandleFabric (or HandlePosixFDAndFabric) makes
// allocations exportable as fabric handles: Resource.ExportFabric returns
// one FabricChunk per physical chunk, plain bytes (MarshalBinary) that any
// channel carries to a process on another node of the same multi-node
// NVLink domain, where Resource.ImportFabric maps them, under the same
// checks as Import's fds. Fabric handles need the IMEX service: without
// it (any single-node machine) creating, exporting or importing fails
// with an error matching cuda.ErrNotSupported that names IMEX (see
// cuda.FabricRequirements).
//
// # NCCL user buffers
//
// NCCLOptions gives the properties NCCL's own allocator (ncclMemAlloc)
// uses, so a Resource made with them yields buffers NCCL can register
// (ncclCommRegister) and use on its zero-copy paths;
// Resource.AllocationProperties reads back what the driver made.
//
// # Failures
//
// Every operation that takes several driver calls (Allocate, Grow in
// place, Grow by moving, Shrink, SetPeerAccess, Close) either completes
// or leaves the allocation exactly as it was: each step is undone when a
// later one fails. Where undoing is itself refused by the driver, nothing
// is lost or released twice: what could not be given back is kept and
// retried by later operations (Resource.Reclaim retries it and reports
// what still fails), and the error says what happened.
//
// Some steps cannot be undone: once memory is unmapped, mapping it again
// may fail too, and a buffer must never stay usable over unmapped memory
// (on a real GPU a stray access poisons the context). An operation that
// gets past such a step therefore finishes, and if giving something back
// failed on the way, its error wraps buffer.ErrPartlyFreed:
//
//   - Close (Deallocate): the buffer is closed anyway and the allocation
//     is gone; what the driver refused is kept for Reclaim.
//   - Grow and Shrink return the new buffer together with the error: the
//     operation took effect, the old buffer is consumed, and the new one
//     is the one to use and close. What was not given back (the old
//     range after a move, chunks past a shrink, a range the driver
//     granted at the wrong address) is kept for Reclaim.
//
// So errors.Is(err, buffer.ErrPartlyFreed) means "done, but not tidy";
// any other error means "not done, nothing changed".
//
// # Lifetimes and streams
//
// Allocations are owned Buffers: Close unmaps and releases everything.
// Mapping is synchronous. Before unmapping, Close (Deallocate), Shrink and
// a Grow that moves wait for the buffer's stream (a buffer allocated with
// a nil stream: the legacy default stream, which CUDA synchronizes with
// every blocking stream), so memory is never unmapped under work
// submitted on it. They wait for that stream only, never for the whole
// device (an idle stream's wait is one cheap driver call); work on other
// streams, such as non-blocking ones, is the caller's to order first, as
// for any stream-ordered free (Buffer.CloseOn names another stream).
//
// A Close of a buffer that a Grow or Shrink is consuming is neither
// refused nor blocked: it returns nil, and the Grow or Shrink fails and
// frees the memory, exactly once (see Resource.Grow).
package virtual
