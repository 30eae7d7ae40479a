// Package virtual allocates GPU memory through CUDA's virtual memory
// management (VMM): physical chunks (cuMemCreate) mapped into reserved
// address ranges. Its Resource is a buffer.MemoryResource whose
// allocations can grow without copying, shrink, change peer access, and be
// exported to other processes as file descriptors.
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
// plus, on the last path only, one map per existing chunk. Data written
// before a grow is intact after it. Every physical handle is released when
// the allocation is freed or shrunk, and a failed grow leaves the original
// allocation as it was (cuda.core leaks handles, #2344, and frees twice on
// its slow path, #2877).
//
// # Failures
//
// Every operation that takes several driver calls (Allocate, Grow in
// place, Grow by moving, Shrink, SetPeerAccess, Close) either completes
// or leaves the allocation exactly as it was: each step is undone when a
// later one fails. Where undoing is itself refused by the driver, nothing
// is lost or released twice: what could not be given back is kept and
// retried by later operations (Resource.Reclaim retries it and reports
// what still fails), and the error says what happened. Two cases cannot be
// undone and say so: a Shrink (or a move by Grow) that took effect but
// could not give everything back returns the new buffer together with the
// error, and a Close that failed half way leaves the buffer unusable
// (ErrClosed) until Close is called again, which finishes the job.
//
// # Lifetimes and streams
//
// Allocations are owned Buffers: Close unmaps and releases everything.
// Mapping is synchronous. Before unmapping, Deallocate waits for the
// buffer's stream (or, with none, for the whole device), so memory is
// never unmapped under running work.
package virtual
