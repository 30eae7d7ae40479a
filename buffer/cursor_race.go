//go:build race

package buffer

import (
	"sync"
	"unsafe"
)

// Under the race detector the cursors are shards, chosen by the address of
// the calling goroutine's stack, each behind a mutex: the detector does
// not know that pinning goroutines to their P orders those that share a
// per-P cursor, and would report each use as a race.

const raceShardBits = 6

var (
	raceShards [1 << raceShardBits]cursor
	raceLocks  [1 << raceShardBits]sync.Mutex
)

func pin() *cursor {
	var local byte
	p := uint64(uintptr(unsafe.Pointer(&local))) >> 10
	i := (p * 0x9e3779b97f4a7c15) >> (64 - raceShardBits)
	raceLocks[i].Lock()
	return &raceShards[i]
}

func unpin(c *cursor) {
	i := (uintptr(unsafe.Pointer(c)) - uintptr(unsafe.Pointer(&raceShards[0]))) / unsafe.Sizeof(raceShards[0])
	raceLocks[i].Unlock()
}

func growCursors() {}

func eachCursor(f func(*cursor)) {
	for i := range raceShards {
		f(&raceShards[i])
	}
}
