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
// # Lifetimes and streams
//
// Allocations are owned Buffers: Close unmaps and releases everything.
// Mapping is synchronous. Before unmapping, Deallocate waits for the
// buffer's stream (or, with none, for the whole device), so memory is
// never unmapped under running work.
package virtual
