package resource

import (
	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// ForBuffers returns the pool as buffer.Allocate uses it for the pool's
// Buffers: its allocations and frees skip the record of addresses handed
// out as plain pointers (which a Buffer, freeing its memory once, does not
// need), and its Record method takes a disowned Buffer's memory into that
// record. Its Deallocate frees any memory of the pool without checking the
// record, so only a Buffer may call it; nil for a nil or zero pool.
func (p *DevicePool) ForBuffers() buffer.MemoryResource {
	if p == nil || p.core.kind == "" {
		return nil
	}
	return poolBuffers{&p.core}
}

// ForBuffers returns the pool as buffer.Allocate uses it: see
// [DevicePool.ForBuffers].
func (p *PinnedPool) ForBuffers() buffer.MemoryResource {
	if p == nil || p.core.kind == "" {
		return nil
	}
	return poolBuffers{&p.core}
}

// poolBuffers is a pool as its Buffers see it (ForBuffers). One pointer,
// so that ForBuffers allocates nothing.
type poolBuffers struct{ c *poolCore }

func (b poolBuffers) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return b.c.allocatePtr(b.c.kind, size, s, false)
}

func (b poolBuffers) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return b.c.deallocate(b.c.kind, ptr, size, s, false)
}

// Record makes a disowned Buffer's memory a plain pointer of the pool, for
// its Deallocate.
func (b poolBuffers) Record(ptr cuda.DevicePtr, size uint64) { b.c.ptrs.add(ptr, size) }

func (b poolBuffers) DeviceAccessible() bool { return true }
func (b poolBuffers) HostAccessible() bool   { return b.c.kind != "DevicePool" }

func (b poolBuffers) DeviceID() int {
	if b.c.kind == "PinnedPool" {
		return -1
	}
	return b.c.dev.Ordinal()
}
