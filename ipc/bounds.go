package ipc

import (
	"math"

	"github.com/cudamem/cudamem/cuda"
)

// within reports whether size bytes from ptr lie inside the mapping of
// rangeSize bytes at base, and how many bytes the mapping holds from ptr
// on. Every comparison is made without a sum that could wrap: a size near
// 2^64 must never pass because ptr+size overflowed.
func within(ptr cuda.DevicePtr, size uint64, base cuda.DevicePtr, rangeSize uint64) (limit uint64, ok bool) {
	if rangeSize > math.MaxUint64-uint64(base) {
		return 0, false // a range that wraps the address space is no mapping
	}
	limit = mappedFrom(ptr, base, rangeSize)
	return limit, ptr >= base && size <= limit
}

// mappedFrom is how many bytes of the mapping at base lie at or after ptr
// (0 when ptr is outside it).
func mappedFrom(ptr, base cuda.DevicePtr, rangeSize uint64) uint64 {
	if ptr < base || uint64(ptr-base) > rangeSize {
		return 0
	}
	return rangeSize - uint64(ptr-base)
}
