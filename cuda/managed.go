package cuda

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// This file holds the driver's managed-memory calls beyond allocation:
// where a range may live (the location constructors), what the driver
// reports of a range (cuMemRangeGetAttribute), and the batched prefetch
// and discard calls of CUDA 13.0. Package resource checks buffers and
// devices on top of them.

// DeviceLocation is the location of device d's memory. A nil d gives a
// device location with ID -1, which every call refuses.
func DeviceLocation(d *Device) MemLocation {
	if d == nil {
		return MemLocation{Type: MemLocationTypeDevice, ID: -1}
	}
	return MemLocation{Type: MemLocationTypeDevice, ID: int32(d.Ordinal())}
}

// HostLocation is host memory, on whichever NUMA node the operating
// system places it (cuda.core's Host()).
func HostLocation() MemLocation { return MemLocation{Type: MemLocationTypeHost} }

// HostNUMALocation is host memory on NUMA node node (cuda.core's
// Host(numa_id=node)).
func HostNUMALocation(node int32) MemLocation {
	return MemLocation{Type: MemLocationTypeHostNUMA, ID: node}
}

// HostNUMACurrentLocation is host memory on the NUMA node of the thread
// that makes the call (cuda.core's Host.numa_current()). Goroutines move
// between threads, so it names the node of whichever thread the driver
// call happens to run on: pin the goroutine (runtime.LockOSThread) and
// its thread for a definite node, or name the node.
func HostNUMACurrentLocation() MemLocation {
	return MemLocation{Type: MemLocationTypeHostNUMACurrent}
}

// IsZero reports whether l is the zero MemLocation: no location (the
// driver's CU_MEM_LOCATION_TYPE_NONE / INVALID).
func (l MemLocation) IsZero() bool { return l == MemLocation{} }

// String describes l for messages: "GPU 0", "host", "host NUMA node 1".
func (l MemLocation) String() string {
	switch l.Type {
	case MemLocationTypeNone:
		return "no location"
	case MemLocationTypeDevice:
		return fmt.Sprintf("GPU %d", l.ID)
	case MemLocationTypeHost:
		return "host"
	case MemLocationTypeHostNUMA:
		return fmt.Sprintf("host NUMA node %d", l.ID)
	case MemLocationTypeHostNUMACurrent:
		return "host NUMA node of the calling thread"
	}
	return fmt.Sprintf("location type %d (id %d)", l.Type, l.ID)
}

// MemRangeAttribute is a CUmem_range_attribute: what cuMemRangeGetAttribute
// reports of a managed range.
type MemRangeAttribute int32

// Managed range attributes. The *Type/*ID pairs (CUDA 12.2) tell host
// NUMA nodes apart; the older PreferredLocation and LastPrefetchLocation
// report a device ordinal or -1 for any host location.
const (
	MemRangeAttrReadMostly               MemRangeAttribute = 1
	MemRangeAttrPreferredLocation        MemRangeAttribute = 2
	MemRangeAttrAccessedBy               MemRangeAttribute = 3
	MemRangeAttrLastPrefetchLocation     MemRangeAttribute = 4
	MemRangeAttrPreferredLocationType    MemRangeAttribute = 5
	MemRangeAttrPreferredLocationID      MemRangeAttribute = 6
	MemRangeAttrLastPrefetchLocationType MemRangeAttribute = 7
	MemRangeAttrLastPrefetchLocationID   MemRangeAttribute = 8
)

// deviceCPU is CU_DEVICE_CPU, the host among the device ordinals a range
// attribute lists (the driver pads the list with CU_DEVICE_INVALID, -2).
const deviceCPU = -1

// ManagedRange is what the driver reports of a range of managed memory:
// the advice in force over all of it and where it was last prefetched.
// A location is the zero MemLocation when the pages of the range disagree,
// or none has one.
type ManagedRange struct {
	// ReadMostly: every page has MemAdviseSetReadMostly.
	ReadMostly bool
	// PreferredLocation is the location set with
	// MemAdviseSetPreferredLocation on every page: a device, the host, or
	// a host NUMA node (a preference for the calling thread's node reads
	// back as the node the driver chose).
	PreferredLocation MemLocation
	// AccessedBy lists the devices, and the host, with
	// MemAdviseSetAccessedBy over the whole range, devices by ordinal, the
	// host last.
	AccessedBy []MemLocation
	// LastPrefetchLocation is where the whole range was last prefetched
	// (asked for: the prefetch may not have run yet).
	LastPrefetchLocation MemLocation
}

// MemRangeInfo reads what the driver reports of the managed range of size
// bytes at p (cuMemRangeGetAttribute, in d's context; the location
// attributes it reads came with CUDA 12.2, as did the MemAdvise and
// MemPrefetchAsync this package speaks). A range the driver does not know
// as managed memory is an error matching ErrorInvalidValue.
func (d *Device) MemRangeInfo(p DevicePtr, size uint64) (ManagedRange, error) {
	var info ManagedRange
	ctx, err := d.contextFor("Device.MemRangeInfo")
	if err != nil {
		return info, err
	}
	if err := checkRange("cuMemRangeGetAttribute", "managed", uint64(p), size); err != nil {
		return info, err
	}
	if p == 0 || size == 0 {
		return info, Errorf("cuMemRangeGetAttribute", ErrInvalidArgument, "empty range (%#x, %d bytes)", uint64(p), size)
	}
	pr := &d.drv.MemRangeGetAttribute
	get := func(attr MemRangeAttribute, data unsafe.Pointer, n uintptr) error {
		if r := pr.CallCtx(ctx, uintptr(data), n, uintptr(attr), uintptr(p), uintptr(size)); !ok(r) {
			return fmt.Errorf("range %#x (%d bytes), attribute %d: %w", uint64(p), size, attr, fail(pr, r))
		}
		return nil
	}
	var rm, prefType, prefID, lastType, lastID int32
	for _, a := range []struct {
		attr MemRangeAttribute
		dst  *int32
	}{
		{MemRangeAttrReadMostly, &rm},
		{MemRangeAttrPreferredLocationType, &prefType},
		{MemRangeAttrPreferredLocationID, &prefID},
		{MemRangeAttrLastPrefetchLocationType, &lastType},
		{MemRangeAttrLastPrefetchLocationID, &lastID},
	} {
		if err := get(a.attr, unsafe.Pointer(a.dst), 4); err != nil {
			return ManagedRange{}, err
		}
	}
	info.ReadMostly = rm != 0
	info.PreferredLocation = rangeLocation(prefType, prefID)
	info.LastPrefetchLocation = rangeLocation(lastType, lastID)
	// One slot per device and one for the host; the driver pads with
	// CU_DEVICE_INVALID.
	ds, err := devices()
	if err != nil {
		return ManagedRange{}, err
	}
	ids := make([]int32, len(ds)+1)
	err = get(MemRangeAttrAccessedBy, unsafe.Pointer(&ids[0]), uintptr(4*len(ids)))
	runtime.KeepAlive(ids)
	if err != nil {
		return ManagedRange{}, err
	}
	host := false
	for _, id := range ids {
		switch {
		case id == deviceCPU:
			host = true
		case id >= 0:
			info.AccessedBy = append(info.AccessedBy, MemLocation{Type: MemLocationTypeDevice, ID: id})
		}
	}
	if host {
		info.AccessedBy = append(info.AccessedBy, HostLocation())
	}
	return info, nil
}

// rangeLocation is the location a *Type/*ID attribute pair reports; the
// ID counts for devices and host NUMA nodes only.
func rangeLocation(typ, id int32) MemLocation {
	switch MemLocationType(typ) {
	case MemLocationTypeDevice, MemLocationTypeHostNUMA:
		return MemLocation{Type: MemLocationType(typ), ID: id}
	case MemLocationTypeHost, MemLocationTypeHostNUMACurrent:
		return MemLocation{Type: MemLocationType(typ)}
	}
	return MemLocation{}
}

// MemPrefetchBatchAsync prefetches len(ptrs) managed ranges, sizes[i]
// bytes at ptrs[i], in one call ordered on s (cuMemPrefetchBatchAsync,
// CUDA 13.0). locs[k] is where the ranges from locIdxs[k] up to the next
// entry's index (the last to the end) go: locIdxs starts at 0 and
// increases, with no more locations than ranges. The ranges may migrate
// in any order.
//
// Everything is checked before the driver is called: slices of unequal
// length, an empty batch, empty or null ranges, ranges that wrap past
// 2^64, bad indices, and the legacy default stream (which the driver
// refuses for batches: use a stream from Device.NewStream) are errors
// matching ErrInvalidArgument. A driver without the call gives an error
// matching ErrNotSupported. The driver needs concurrent managed access on
// every device.
func (s *Stream) MemPrefetchBatchAsync(ptrs []DevicePtr, sizes []uint64, locs []MemLocation, locIdxs []uint64) error {
	return s.managedBatch("Stream.MemPrefetchBatchAsync", func(d *driver) *loader.Proc { return &d.MemPrefetchBatchAsync }, ptrs, sizes, locs, locIdxs, true)
}

// MemDiscardBatchAsync tells the driver that the contents of len(ptrs)
// managed ranges are no longer needed, in one call ordered on s
// (cuMemDiscardBatchAsync, CUDA 13.0): their pages may be dropped rather
// than migrated, and reading them before a write or a prefetch returns
// indeterminate values. What it refuses is as for MemPrefetchBatchAsync.
func (s *Stream) MemDiscardBatchAsync(ptrs []DevicePtr, sizes []uint64) error {
	return s.managedBatch("Stream.MemDiscardBatchAsync", func(d *driver) *loader.Proc { return &d.MemDiscardBatchAsync }, ptrs, sizes, nil, nil, false)
}

// MemDiscardAndPrefetchBatchAsync discards len(ptrs) managed ranges and
// prefetches them to locs (as MemPrefetchBatchAsync places them), in one
// call ordered on s (cuMemDiscardAndPrefetchBatchAsync, CUDA 13.0): the
// pages are made resident at their location without their old contents
// being moved. What it refuses is as for MemPrefetchBatchAsync.
func (s *Stream) MemDiscardAndPrefetchBatchAsync(ptrs []DevicePtr, sizes []uint64, locs []MemLocation, locIdxs []uint64) error {
	return s.managedBatch("Stream.MemDiscardAndPrefetchBatchAsync", func(d *driver) *loader.Proc { return &d.MemDiscardAndPrefetchBatchAsync }, ptrs, sizes, locs, locIdxs, true)
}

// managedBatch checks and submits one of the three batched calls; with
// withLocs the call takes locations.
func (s *Stream) managedBatch(op string, proc func(*driver) *loader.Proc, ptrs []DevicePtr, sizes []uint64, locs []MemLocation, locIdxs []uint64, withLocs bool) error {
	n := len(ptrs)
	if len(sizes) != n {
		return Errorf(op, ErrInvalidArgument, "ptrs and sizes differ in length (%d and %d)", n, len(sizes))
	}
	if n == 0 {
		return Errorf(op, ErrInvalidArgument, "empty batch")
	}
	for i := range n {
		p, z := uint64(ptrs[i]), sizes[i]
		switch {
		case p == 0 || z == 0:
			return Errorf(op, ErrInvalidArgument, "range %d of %d: null or empty (%#x, %d bytes)", i, n, p, z)
		case p+z < p:
			return Errorf(op, ErrInvalidArgument, "range %d of %d: %#x + %d bytes wraps past 2^64", i, n, p, z)
		}
	}
	if withLocs {
		if err := checkLocRuns(op, locs, locIdxs, n); err != nil {
			return err
		}
	}
	ctx, h, err := s.begin(op)
	if err != nil {
		return err
	}
	defer s.end()
	if legacyStream(h) {
		return Errorf(op, ErrInvalidArgument, "the legacy default stream of %v: the driver refuses it for batched prefetches and discards (use a stream from Device.NewStream)", s.dev)
	}
	p := proc(s.dev.drv)
	pp := uintptr(unsafe.Pointer(&ptrs[0]))
	var zs []uintptr // size_t
	if unsafe.Sizeof(uintptr(0)) == 8 {
		zs = unsafe.Slice((*uintptr)(unsafe.Pointer(&sizes[0])), n)
	} else {
		zs = make([]uintptr, n)
		for i, z := range sizes {
			if uint64(uintptr(z)) != z {
				return Errorf(op, ErrInvalidArgument, "range %d of %d: %d bytes do not fit this target's size_t", i, n, z)
			}
			zs[i] = uintptr(z)
		}
	}
	zp := uintptr(unsafe.Pointer(&zs[0]))
	var r uintptr
	if withLocs {
		idx := make([]uintptr, len(locIdxs))
		for k, v := range locIdxs {
			idx[k] = uintptr(v)
		}
		r = p.CallCtx(ctx, pp, zp, uintptr(n), uintptr(unsafe.Pointer(&locs[0])), uintptr(unsafe.Pointer(&idx[0])), uintptr(len(locs)), 0, h)
		runtime.KeepAlive(idx)
		runtime.KeepAlive(locs)
	} else {
		r = p.CallCtx(ctx, pp, zp, uintptr(n), 0, h)
	}
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(sizes)
	runtime.KeepAlive(zs)
	if !ok(r) {
		return &OpError{Op: p.Name(), Err: fmt.Errorf("%w (a batch of %d ranges on stream %#x)", fail(p, r).(*OpError).Err, n, h)}
	}
	return nil
}

// checkLocRuns checks locations and their start indices against a batch
// of n ranges as the driver would, naming the bad entry.
func checkLocRuns(op string, locs []MemLocation, idxs []uint64, n int) error {
	switch {
	case len(locs) != len(idxs):
		return Errorf(op, ErrInvalidArgument, "locs and locIdxs differ in length (%d and %d)", len(locs), len(idxs))
	case len(locs) == 0:
		return Errorf(op, ErrInvalidArgument, "no location for a batch of %d ranges", n)
	case len(locs) > n:
		return Errorf(op, ErrInvalidArgument, "%d locations for %d ranges (at most one per range)", len(locs), n)
	}
	for k, l := range locs {
		switch {
		case k == 0 && idxs[0] != 0:
			return Errorf(op, ErrInvalidArgument, "locIdxs[0] is %d: the first location must apply from range 0", idxs[0])
		case k > 0 && idxs[k] <= idxs[k-1]:
			return Errorf(op, ErrInvalidArgument, "locIdxs[%d] = %d does not follow locIdxs[%d] = %d (indices must increase)", k, idxs[k], k-1, idxs[k-1])
		case idxs[k] >= uint64(n):
			return Errorf(op, ErrInvalidArgument, "locIdxs[%d] = %d is past the last range (%d ranges)", k, idxs[k], n)
		case l.Type < MemLocationTypeDevice || l.Type > MemLocationTypeHostNUMACurrent:
			return Errorf(op, ErrInvalidArgument, "locs[%d] is %s (want a device, the host or a host NUMA node)", k, l)
		}
	}
	return nil
}
