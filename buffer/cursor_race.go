//go:build race

package buffer

import (
	"sync"
	"unsafe"
)

// Under the race detector the cursors are shards, chosen by the address
// of the calling goroutine's stack, each with a mutex: the detector does
// not know that pinning a goroutine to its P orders the goroutines that
// share a per-P cursor, and would report each as a race.

type cursorLock struct{ mu sync.Mutex }

const raceShardBits = 6

var raceShards [1 << raceShardBits]cursor

func init() {
	for i := range raceShards {
		raceShards[i].home = -1
	}
}

func pin() int {
	var local byte
	p := uint64(uintptr(unsafe.Pointer(&local))) >> 10
	id := int((p * 0x9e3779b97f4a7c15) >> (64 - raceShardBits))
	raceShards[id].lock.mu.Lock()
	return id
}

func unpin(id int) { raceShards[id].lock.mu.Unlock() }

func cursorOf(id int) *cursor { return &raceShards[id] }

func growCursors() {}

func dropSlabs() {
	for i := range raceShards {
		raceShards[i].slab.Store(nil)
	}
}
