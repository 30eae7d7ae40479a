package resource

import (
	"fmt"
	"sync/atomic"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Stats is a snapshot of a Statistics resource's counters, in the terms of
// RMM's statistics_resource_adaptor and PyTorch's memory_stats
// ("allocated_bytes.all.{current,peak,allocated}").
type Stats struct {
	// CurrentBytes and CurrentCount are the bytes and allocations live
	// now: allocated and not yet deallocated.
	CurrentBytes, CurrentCount uint64
	// PeakBytes and PeakCount are the highest CurrentBytes and
	// CurrentCount since the resource was made or ResetPeak was called.
	// The two peaks are tracked separately, so they may come from
	// different moments.
	PeakBytes, PeakCount uint64
	// TotalBytes and TotalCount add up every successful allocation ever.
	TotalBytes, TotalCount uint64
	// Failures counts Allocate calls the upstream refused.
	Failures uint64
}

// String formats the counters for logs.
func (s Stats) String() string {
	return fmt.Sprintf("current %d bytes in %d allocations, peak %d bytes / %d allocations, total %d bytes in %d allocations, %d failures",
		s.CurrentBytes, s.CurrentCount, s.PeakBytes, s.PeakCount, s.TotalBytes, s.TotalCount, s.Failures)
}

// Statistics counts what goes through it: current, peak and total bytes
// and allocations, and failed allocations, for any upstream, without
// asking the driver (a pool's UsedMemCurrent mixes every user of the
// pool, and rounds).
//
// The counters are separate atomics, with no lock: a pair costs a few
// uncontended atomic operations more, but a snapshot taken while other
// goroutines allocate may mix moments (CurrentBytes and CurrentCount may
// be one allocation apart). Stats never reports a peak below the current
// value it read. Buffers from Allocate are owned by the Statistics, so
// that their Close is counted. Statistics is safe for concurrent use.
type Statistics struct {
	up buffer.MemoryResource

	curBytes, peakBytes, totalBytes atomic.Uint64
	curCount, peakCount, totalCount atomic.Uint64
	failures                        atomic.Uint64
}

var _ buffer.MemoryResource = (*Statistics)(nil)

// NewStatistics returns a resource that allocates from upstream and counts
// the allocations. A nil upstream makes every Allocate fail with an error
// matching cuda.ErrInvalidArgument.
func NewStatistics(upstream buffer.MemoryResource) *Statistics {
	return &Statistics{up: adaptorUpstream(upstream)}
}

// Allocate allocates from the upstream and counts the allocation, or the
// failure. Upstream errors are returned unchanged.
func (r *Statistics) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]): the
// address (0 for size 0) and the stream the upstream ordered it on,
// counted. Free it with Deallocate.
func (r *Statistics) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if r == nil || r.up == nil {
		return 0, nil, errNoUpstream("Statistics", "Allocate")
	}
	ptr, us, err := r.up.AllocatePtr(size, s)
	if err != nil {
		r.failures.Add(1)
		return 0, nil, err
	}
	if ptr != 0 { // an empty allocation owns nothing and is never deallocated
		// Saturating: byte counts summed over a long run (or sizes near
		// 2^64 from a fake upstream) stop at the maximum, never wrap.
		raiseTo(&r.peakBytes, addSat(&r.curBytes, size))
		raiseTo(&r.peakCount, r.curCount.Add(1))
		addSat(&r.totalBytes, size)
		r.totalCount.Add(1)
	}
	return ptr, us, nil
}

// Deallocate frees through the upstream and, once the upstream succeeded,
// takes the allocation off the current counters (never below zero, even
// for memory this Statistics did not allocate). A zero ptr does nothing.
func (r *Statistics) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if r == nil || r.up == nil {
		return errNoUpstream("Statistics", "Deallocate")
	}
	gone, err := freeThrough(r.up, ptr, size, s)
	if gone {
		subSat(&r.curBytes, size)
		subSat(&r.curCount, 1)
	}
	return err
}

// Stats returns the counters (zero for a nil Statistics).
func (r *Statistics) Stats() Stats {
	if r == nil {
		return Stats{}
	}
	st := Stats{
		CurrentBytes: r.curBytes.Load(),
		CurrentCount: r.curCount.Load(),
		PeakBytes:    r.peakBytes.Load(),
		PeakCount:    r.peakCount.Load(),
		TotalBytes:   r.totalBytes.Load(),
		TotalCount:   r.totalCount.Load(),
		Failures:     r.failures.Load(),
	}
	// An Allocate between its current and peak updates, or racing
	// ResetPeak, can leave a peak below current for a moment.
	st.PeakBytes = max(st.PeakBytes, st.CurrentBytes)
	st.PeakCount = max(st.PeakCount, st.CurrentCount)
	return st
}

// ResetPeak starts a new peak from the current values, as PyTorch's
// reset_peak_memory_stats does: measure the high watermark of one phase
// of a program. Totals and failures keep counting.
func (r *Statistics) ResetPeak() {
	if r == nil {
		return
	}
	r.peakBytes.Store(r.curBytes.Load())
	r.peakCount.Store(r.curCount.Load())
}

// Upstream is the resource r allocates from (nil if none).
func (r *Statistics) Upstream() buffer.MemoryResource {
	if r == nil {
		return nil
	}
	return r.up
}

// DeviceAccessible, HostAccessible and DeviceID answer for the upstream.
func (r *Statistics) DeviceAccessible() bool { return upDeviceAccessible(r.Upstream()) }
func (r *Statistics) HostAccessible() bool   { return upHostAccessible(r.Upstream()) }
func (r *Statistics) DeviceID() int          { return upDeviceID(r.Upstream()) }

// String describes the resource for logs.
func (r *Statistics) String() string {
	if r == nil {
		return "Statistics(nil)"
	}
	return adaptorString("Statistics", r.up, fmt.Sprintf("%d bytes in %d allocations", r.curBytes.Load(), r.curCount.Load()))
}
