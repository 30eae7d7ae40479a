package buffer

import "github.com/cudamem/cudamem/cuda"

// CollectOne runs the safety net over a slab holding one leaked owned
// Buffer of mr (ptr, size, allocated on s), as the slab's finalizer does,
// but at once and on the caller's goroutine: the counters are final when
// it returns.
func CollectOne(mr MemoryResource, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) {
	sl := new(slab) // no finalizer: collected here, once
	b := &sl[0]
	b.ptr, b.size, b.home = ptr, size, &home{mr: mr, free: mr, stream: s}
	b.word.Store(initBit | ownedBit)
	collectSlab(sl)
}

// FreeOrFallback is the free that the safety net and the last Hold's
// Release make.
func FreeOrFallback(mr MemoryResource, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return freeOrFallback(mr, ptr, size, s)
}
