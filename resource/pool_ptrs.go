package resource

import (
	"sync"

	"github.com/cudamem/cudamem/cuda"
)

// ptrSet is the set of addresses a pool resource handed out and has not
// freed, with their sizes. Deallocate takes an address out before it frees
// it and refuses one that is not there, because cuMemFreeAsync frees
// memory from any pool: without the set, another pool's (or another
// library's) pointer handed to this resource would be freed behind its
// owner's back, and this pool's live count would drop for an allocation it
// never made, letting the pool be destroyed under memory still in use.
//
// It is split in shards, each with its own lock, so that goroutines
// allocating and freeing different addresses from one pool rarely meet.
type ptrSet struct {
	shards [ptrShards]ptrShard
}

const ptrShards = 64

type ptrShard struct {
	mu sync.Mutex
	m  map[cuda.DevicePtr]uint64
	_  [64 - 16]byte // one cache line a shard
}

func (s *ptrSet) shard(p cuda.DevicePtr) *ptrShard {
	// Pool addresses are aligned: hash them (Fibonacci hashing) so that
	// neighbouring allocations spread over the shards.
	return &s.shards[(uint64(p)*0x9e3779b97f4a7c15)>>58]
}

// add records p (size bytes) as handed out.
func (s *ptrSet) add(p cuda.DevicePtr, size uint64) {
	sh := s.shard(p)
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[cuda.DevicePtr]uint64)
	}
	sh.m[p] = size
	sh.mu.Unlock()
}

// take removes p and reports the size it was recorded with; ok is false
// if p was not handed out (or was taken already).
func (s *ptrSet) take(p cuda.DevicePtr) (size uint64, ok bool) {
	sh := s.shard(p)
	sh.mu.Lock()
	size, ok = sh.m[p]
	if ok {
		delete(sh.m, p)
	}
	sh.mu.Unlock()
	return size, ok
}
