package resource

import (
	"fmt"
	"strings"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// This file holds what a program does with managed memory once allocated
// (from Managed, ManagedPool, or any cuMemAllocManaged memory wrapped in a
// Buffer): advice set and read back, prefetch, discard and
// discard-and-prefetch, one buffer at a time or in batches. cuda.core:
// ManagedBuffer and cuda.core.utils' prefetch_batch, discard_batch and
// discard_prefetch_batch.

// checkLocation validates a location given as argument name of op: a
// device that exists, the host, a host NUMA node, or the calling thread's
// node. The zero MemLocation (no location) is refused: the operations
// that take one need it.
func checkLocation(op, name string, loc cuda.MemLocation) error {
	switch loc.Type {
	case cuda.MemLocationTypeNone:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s: a location is required (cuda.DeviceLocation, cuda.HostLocation, cuda.HostNUMALocation or cuda.HostNUMACurrentLocation)", name)
	case cuda.MemLocationTypeDevice:
		if _, err := cuda.GetDevice(int(loc.ID)); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%s %s: %w", name, loc, err)}
		}
	case cuda.MemLocationTypeHost, cuda.MemLocationTypeHostNUMACurrent:
	case cuda.MemLocationTypeHostNUMA:
		if loc.ID < 0 {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s: negative NUMA node %d", name, loc.ID)
		}
	default:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s: %s is not a device, host or host NUMA location", name, loc)
	}
	return nil
}

// checkConcurrent refuses a device location (argument name of op) whose
// device lacks concurrent managed access: the driver takes a device as a
// prefetch target, preferred location or accessor only then.
func checkConcurrent(op, name string, loc cuda.MemLocation) error {
	if loc.Type != cuda.MemLocationTypeDevice {
		return nil
	}
	d, err := cuda.GetDevice(int(loc.ID))
	if err != nil {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%s %s: %w", name, loc, err)}
	}
	f, err := d.Features()
	if err != nil {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", d, err)}
	}
	if !f.ConcurrentManagedAccess {
		return cuda.Errorf(op, cuda.ErrNotSupported, "%s %s: %v lacks concurrent managed access, without which the driver takes no device here", name, loc, d)
	}
	return nil
}

// checkAllConcurrent refuses, for op, a machine where some device lacks
// concurrent managed access: the batched calls need it on every device.
func checkAllConcurrent(op string) error {
	devs, err := cuda.Devices()
	if err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	var lack []string
	for _, d := range devs {
		f, err := d.Features()
		if err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", d, err)}
		}
		if !f.ConcurrentManagedAccess {
			lack = append(lack, d.String())
		}
	}
	if len(lack) > 0 {
		return cuda.Errorf(op, cuda.ErrNotSupported, "%s lack(s) concurrent managed access, which the driver's batched prefetch and discard need on every device", strings.Join(lack, ", "))
	}
	return nil
}

// managedRange checks that b is an open buffer of managed memory and
// returns its address, size and the device whose context serves calls on
// it. A zero-size buffer returns size 0 and no device.
func managedRange(op string, b *buffer.Buffer) (cuda.DevicePtr, uint64, *cuda.Device, error) {
	if b == nil {
		return 0, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	ptr, size := b.Ptr(), b.Size()
	if ptr == 0 {
		if b.IsClosed() {
			return 0, 0, nil, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		}
		if size == 0 {
			return 0, 0, nil, nil
		}
		return 0, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer of %d bytes at address 0", size)
	}
	if size == 0 {
		return ptr, 0, nil, nil
	}
	info, err := cuda.QueryPointer(ptr)
	if err != nil {
		return 0, 0, nil, &cuda.OpError{Op: op, Err: fmt.Errorf("buffer %#x (%d bytes): %w", uint64(ptr), size, err)}
	}
	if !info.Managed {
		return 0, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument,
			"buffer %#x (%d bytes) is not managed memory (allocate it from Managed or ManagedPool)", uint64(ptr), size)
	}
	switch r := b.Resource().(type) {
	case *Managed:
		if r != nil && r.dev != nil {
			return ptr, size, r.dev, nil
		}
	case *ManagedPool:
		if r != nil && r.core.dev != nil {
			return ptr, size, r.core.dev, nil
		}
	}
	dev, err := cuda.GetDevice(info.Device)
	if err != nil {
		if dev, err = cuda.GetDevice(0); err != nil {
			return 0, 0, nil, &cuda.OpError{Op: op, Err: err}
		}
	}
	return ptr, size, dev, nil
}

// useRange runs call under b.Use, so that a concurrent Close cannot free
// the range at ptr (what managedRange returned) mid-call.
func useRange(op string, b *buffer.Buffer, ptr cuda.DevicePtr, call func() error) error {
	return b.Use(op, func(cur cuda.DevicePtr) error {
		if cur != ptr {
			return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		}
		return call()
	})
}

// useAll runs call with every buffer of bufs held open (useRange, each at
// its ptrs entry).
func useAll(op string, bufs []*buffer.Buffer, ptrs []cuda.DevicePtr, call func() error) error {
	if len(bufs) == 0 {
		return call()
	}
	return useRange(op, bufs[0], ptrs[0], func() error { return useAll(op, bufs[1:], ptrs[1:], call) })
}

// Prefetch migrates a managed buffer's pages toward loc (a device, the
// host or a host NUMA node), ordered on s: work queued on s afterwards
// finds them there. A nil s means the legacy default stream of the target
// device (of the buffer's device for host targets). A buffer that is not
// managed memory is an error matching cuda.ErrInvalidArgument; a closed
// one, cuda.ErrClosed; a device target without concurrent managed access,
// cuda.ErrNotSupported; a capturing stream, cuda.ErrCapturing.
// QueryManaged reads the location back.
func Prefetch(b *buffer.Buffer, loc cuda.MemLocation, s *cuda.Stream) error {
	const op = "Prefetch"
	if err := checkLocation(op, "target", loc); err != nil {
		return err
	}
	ptr, size, dev, err := managedRange(op, b)
	if err != nil || size == 0 {
		return err
	}
	if err := checkConcurrent(op, "target", loc); err != nil {
		return err
	}
	if s == nil {
		s = dev.DefaultStream()
		if loc.Type == cuda.MemLocationTypeDevice {
			d, err := cuda.GetDevice(int(loc.ID))
			if err != nil {
				return &cuda.OpError{Op: op, Err: err}
			}
			s = d.DefaultStream()
		}
	}
	// A prefetch is not a graph node cudamem relies on: refused while s
	// (or, for the legacy stream, a blocking stream) captures.
	if err := s.RefuseCapture(op); err != nil {
		return err
	}
	if sd := s.Device(); sd != nil && loc.Type == cuda.MemLocationTypeDevice {
		// The driver wants concurrent managed access of the stream's
		// device too.
		if err := checkConcurrent(op, "stream's device", cuda.DeviceLocation(sd)); err != nil {
			return err
		}
	}
	return useRange(op, b, ptr, func() error {
		if err := s.MemPrefetchAsync(ptr, size, loc); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("buffer %#x (%d bytes) to %s: %w", uint64(ptr), size, loc, err)}
		}
		return nil
	})
}

// adviceNames names the advice values for messages.
var adviceNames = map[cuda.MemAdvice]string{
	cuda.MemAdviseSetReadMostly:          "SetReadMostly",
	cuda.MemAdviseUnsetReadMostly:        "UnsetReadMostly",
	cuda.MemAdviseSetPreferredLocation:   "SetPreferredLocation",
	cuda.MemAdviseUnsetPreferredLocation: "UnsetPreferredLocation",
	cuda.MemAdviseSetAccessedBy:          "SetAccessedBy",
	cuda.MemAdviseUnsetAccessedBy:        "UnsetAccessedBy",
}

// Advise tells the driver how a managed buffer will be used
// (cuMemAdvise); QueryManaged reads the advice back. loc is the preferred
// location for SetPreferredLocation (a device, the host, a host NUMA
// node) and the accessor for *AccessedBy (a device or the host: host NUMA
// locations are refused, matching cuda.ErrInvalidArgument). The driver
// documents loc as ignored for *ReadMostly and UnsetPreferredLocation, yet
// rejects an invalid one (CUDA_ERROR_INVALID_VALUE): pass the zero
// MemLocation there and Advise sends the buffer's device in its place. A
// device without concurrent managed access cannot be a preferred location
// or accessor (cuda.ErrNotSupported). A buffer that is not managed memory
// is an error matching cuda.ErrInvalidArgument.
func Advise(b *buffer.Buffer, advice cuda.MemAdvice, loc cuda.MemLocation) error {
	const op = "Advise"
	name, known := adviceNames[advice]
	if !known {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "unknown advice %d", advice)
	}
	switch advice {
	case cuda.MemAdviseSetPreferredLocation, cuda.MemAdviseSetAccessedBy, cuda.MemAdviseUnsetAccessedBy:
		if err := checkLocation(op, name+" location", loc); err != nil {
			return err
		}
	}
	if advice == cuda.MemAdviseSetAccessedBy || advice == cuda.MemAdviseUnsetAccessedBy {
		if loc.Type != cuda.MemLocationTypeDevice && loc.Type != cuda.MemLocationTypeHost {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s does not support %s (a device or the host only)", name, loc)
		}
	}
	ptr, size, dev, err := managedRange(op, b)
	if err != nil || size == 0 {
		return err
	}
	switch advice {
	case cuda.MemAdviseSetReadMostly, cuda.MemAdviseUnsetReadMostly, cuda.MemAdviseUnsetPreferredLocation:
		if loc.IsZero() {
			loc = deviceLoc(dev)
		}
	case cuda.MemAdviseSetPreferredLocation, cuda.MemAdviseSetAccessedBy:
		if err := checkConcurrent(op, name+" location", loc); err != nil {
			return err
		}
	}
	return useRange(op, b, ptr, func() error {
		if err := dev.MemAdvise(ptr, size, advice, loc); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%s for buffer %#x (%d bytes), %s: %w", name, uint64(ptr), size, loc, err)}
		}
		return nil
	})
}

// QueryManaged reads what the driver reports of a managed buffer
// (cuMemRangeGetAttribute): whether it is read-mostly, its preferred
// location, who has accessed-by advice, and where it was last prefetched
// (see cuda.ManagedRange). An empty buffer reports the zero ManagedRange.
// A buffer that is not managed memory is an error matching
// cuda.ErrInvalidArgument; a closed one, cuda.ErrClosed.
func QueryManaged(b *buffer.Buffer) (cuda.ManagedRange, error) {
	const op = "QueryManaged"
	ptr, size, dev, err := managedRange(op, b)
	if err != nil || size == 0 {
		return cuda.ManagedRange{}, err
	}
	var info cuda.ManagedRange
	err = useRange(op, b, ptr, func() error {
		var err error
		if info, err = dev.MemRangeInfo(ptr, size); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("buffer %#x (%d bytes): %w", uint64(ptr), size, err)}
		}
		return nil
	})
	return info, err
}

// Discard tells the driver that a managed buffer's contents are no
// longer needed (cuMemDiscardBatchAsync, CUDA 13.0), ordered on s: its
// pages may be dropped instead of migrated, and reads before the next
// write or prefetch return indeterminate values. It refuses what
// DiscardBatch refuses.
func Discard(b *buffer.Buffer, s *cuda.Stream) error {
	return managedBatch("Discard", []*buffer.Buffer{b}, nil, s, true, false)
}

// DiscardPrefetch discards a managed buffer's contents and makes its
// pages resident at loc, ordered on s (cuMemDiscardAndPrefetchBatchAsync,
// CUDA 13.0): a prefetch that moves no data, for memory about to be
// overwritten. It refuses what DiscardPrefetchBatch refuses.
func DiscardPrefetch(b *buffer.Buffer, loc cuda.MemLocation, s *cuda.Stream) error {
	return managedBatch("DiscardPrefetch", []*buffer.Buffer{b}, []cuda.MemLocation{loc}, s, true, true)
}

// PrefetchBatch prefetches managed buffers in one driver call, ordered on
// s (cuMemPrefetchBatchAsync, CUDA 13.0): to locs[0] for all, or bufs[i]
// to locs[i]. The buffers may migrate in any order. Empty buffers are
// skipped.
//
// It refuses, before the driver is called, with errors matching
// cuda.ErrInvalidArgument: no buffers, a number of locations other than 1
// or len(bufs), a buffer that is not managed memory (named by its index),
// and a nil or legacy default stream, which the driver refuses for
// batches (use a stream from Device.NewStream). A closed buffer or stream
// matches cuda.ErrClosed; a capturing stream, cuda.ErrCapturing; a driver
// without the call or a device without concurrent managed access (the
// driver needs it on every device), cuda.ErrNotSupported.
func PrefetchBatch(bufs []*buffer.Buffer, locs []cuda.MemLocation, s *cuda.Stream) error {
	return managedBatch("PrefetchBatch", bufs, locs, s, false, true)
}

// DiscardBatch discards managed buffers' contents (see Discard) in one
// driver call, ordered on s (cuMemDiscardBatchAsync). It refuses what
// PrefetchBatch refuses.
func DiscardBatch(bufs []*buffer.Buffer, s *cuda.Stream) error {
	return managedBatch("DiscardBatch", bufs, nil, s, true, false)
}

// DiscardPrefetchBatch discards managed buffers' contents and makes them
// resident at locs (one for all, or one per buffer) in one driver call,
// ordered on s (cuMemDiscardAndPrefetchBatchAsync). It refuses what
// PrefetchBatch refuses.
func DiscardPrefetchBatch(bufs []*buffer.Buffer, locs []cuda.MemLocation, s *cuda.Stream) error {
	return managedBatch("DiscardPrefetchBatch", bufs, locs, s, true, true)
}

// managedBatch is the six operations above: discard, prefetch to locs, or
// both, over bufs in one driver call on s.
func managedBatch(op string, bufs []*buffer.Buffer, locs []cuda.MemLocation, s *cuda.Stream, discard, prefetch bool) error {
	n := len(bufs)
	if n == 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "empty batch: no buffers")
	}
	if prefetch {
		if len(locs) != 1 && len(locs) != n {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%d locations for %d buffers: the length must be 1 (one location for all) or the number of buffers", len(locs), n)
		}
		for k, l := range locs {
			if err := checkLocation(op, fmt.Sprintf("location %d", k), l); err != nil {
				return err
			}
		}
	}
	if s == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil stream: the driver's batched prefetch and discard refuse the legacy default stream (use a stream from Device.NewStream)")
	}
	s, err := (*cuda.Device)(nil).ResolveStream(op, s, false)
	if err != nil {
		return err
	}
	if s.IsDefault() {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "the legacy default stream of %v: the driver's batched prefetch and discard refuse it (use a stream from Device.NewStream)", s.Device())
	}
	kept := make([]*buffer.Buffer, 0, n)
	ptrs := make([]cuda.DevicePtr, 0, n)
	sizes := make([]uint64, 0, n)
	var runs []cuda.MemLocation // the locations of the kept buffers, as runs
	var starts []uint64         // the index of each run's first kept buffer
	for i, b := range bufs {
		ptr, size, _, err := managedRange(op, b)
		if err != nil {
			return fmt.Errorf("%w (buffer %d of %d)", err, i, n)
		}
		if size == 0 {
			continue
		}
		if prefetch {
			l := locs[0]
			if len(locs) == n {
				l = locs[i]
			}
			if len(runs) == 0 || runs[len(runs)-1] != l {
				runs, starts = append(runs, l), append(starts, uint64(len(ptrs)))
			}
		}
		kept, ptrs, sizes = append(kept, b), append(ptrs, ptr), append(sizes, size)
	}
	if len(kept) == 0 {
		return nil
	}
	if err := checkAllConcurrent(op); err != nil {
		return err
	}
	if err := s.RefuseCapture(op); err != nil {
		return err
	}
	return useAll(op, kept, ptrs, func() error {
		var err error
		switch {
		case discard && prefetch:
			err = s.MemDiscardAndPrefetchBatchAsync(ptrs, sizes, runs, starts)
		case prefetch:
			err = s.MemPrefetchBatchAsync(ptrs, sizes, runs, starts)
		default:
			err = s.MemDiscardBatchAsync(ptrs, sizes)
		}
		if err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%d buffers: %w", len(kept), err)}
		}
		return nil
	})
}
