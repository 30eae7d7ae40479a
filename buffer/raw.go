package buffer

import "github.com/cudamem/cudamem/cuda"

// RawResource is a MemoryResource that can also hand out memory without
// wrapping it in a Buffer. It is optional: layers that only pass memory
// through (the adaptors and the sub-allocator of package resource) ask
// their upstream for it, and use AllocatePtr when it is there, so that a
// stack of them builds one Buffer per allocation, at the top, instead of
// one per layer, as RMM's adaptors forward a pointer.
//
// The memory AllocatePtr returns belongs to the caller, with no safety
// net: it must reach Deallocate(ptr, size, stream) of the same resource
// exactly once, directly or, as the layers above do, by being wrapped
// ([Owned]) in a Buffer owned by a resource whose Deallocate forwards to
// this one.
type RawResource interface {
	MemoryResource
	// AllocatePtr allocates size bytes ordered on s, as Allocate does,
	// and returns the address (0 for size 0) and the stream the memory
	// is ordered on: s, or the stream the resource takes a nil s for
	// (what Buffer.Stream would report). It fails as Allocate does, and
	// on nil and zero values returns an error, never panics.
	AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error)
}
