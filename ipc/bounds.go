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

// addressRanger is the cuMemGetAddressRange wrapper a *cuda.Device may
// offer (the loader resolves the entry point; package cuda does not wrap
// it yet). Where it exists, mappingOf asks it; otherwise the pointer's
// range attributes (cuPointerGetAttribute) give the same answer.
type addressRanger interface {
	MemGetAddressRange(p cuda.DevicePtr) (base cuda.DevicePtr, size uint64, err error)
}

// mappingOf returns the start and size of the allocation (mapping)
// containing ptr, as the driver reports it.
func mappingOf(dev *cuda.Device, ptr cuda.DevicePtr) (cuda.DevicePtr, uint64, error) {
	if ar, ok := any(dev).(addressRanger); ok && dev != nil {
		return ar.MemGetAddressRange(ptr)
	}
	info, err := cuda.QueryPointer(ptr)
	if err != nil {
		return 0, 0, err
	}
	return info.RangeBase, info.RangeSize, nil
}
