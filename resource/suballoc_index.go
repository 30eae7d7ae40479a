package resource

// SubAllocator: the address index of live chunks.

import (
	"math/bits"
)

// subIndex finds live chunks by address: an open-addressing hash table
// with linear probing and backward-shift deletion. A Go map would do, but
// costs about three times as much here, most of it in deleting (a map
// that becomes empty draws a new random seed, which one-allocation-at-a-
// time workloads hit on every free), and its values would be scanned by
// the collector; hash flooding, which that seed defends against, cannot
// happen with addresses the sub-allocator chose itself.
type subIndex struct {
	slots []subSlot // a power of two long, at most half full
	n     int
	shift uint // 64 - log2(len(slots))
}

type subSlot struct {
	addr uint64 // 0: empty (no allocation starts at address 0)
	size uint64 // the chunk's size, for the per-stream caches' checks
	c    int32
}

func (x *subIndex) home(addr uint64) uint64 {
	return (addr * 0x9e3779b97f4a7c15) >> x.shift // Fibonacci hashing: the high bits mix every address bit
}

func (x *subIndex) get(addr uint64) int32 {
	c, _ := x.lookup(addr)
	return c
}

// lookup returns the chunk at addr and its size (0, 0 if none).
func (x *subIndex) lookup(addr uint64) (int32, uint64) {
	if x.n == 0 || addr == 0 {
		return 0, 0
	}
	mask := uint64(len(x.slots) - 1)
	for i := x.home(addr); ; i = (i + 1) & mask {
		switch x.slots[i].addr {
		case addr:
			return x.slots[i].c, x.slots[i].size
		case 0:
			return 0, 0
		}
	}
}

// put adds chunk c of size bytes at addr, which is not in the index.
func (x *subIndex) put(addr uint64, c int32, size uint64) {
	if 2*(x.n+1) > len(x.slots) {
		x.resize()
	}
	mask := uint64(len(x.slots) - 1)
	i := x.home(addr)
	for x.slots[i].addr != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = subSlot{addr, size, c}
	x.n++
}

// remove deletes addr, which is in the index, moving later entries of its
// probe run back so that no tombstones are needed.
func (x *subIndex) remove(addr uint64) {
	mask := uint64(len(x.slots) - 1)
	i := x.home(addr)
	for x.slots[i].addr != addr {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; x.slots[j].addr != 0; j = (j + 1) & mask {
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if h := x.home(x.slots[j].addr); (j-h)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = subSlot{}
	x.n--
}

func (x *subIndex) resize() {
	old := x.slots
	size := max(64, 2*len(old))
	x.slots = make([]subSlot, size)
	x.shift = uint(64 - bits.TrailingZeros(uint(size)))
	x.n = 0
	for _, s := range old {
		if s.addr != 0 {
			x.put(s.addr, s.c, s.size)
		}
	}
}
