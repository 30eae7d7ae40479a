package resource

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/frames"
)

// TrackingOptions configures NewTracking. A nil *TrackingOptions means the
// zero value.
type TrackingOptions struct {
	// CaptureStacks records the call stack of every Allocate (up to 32
	// frames), so Report can say where leaked memory was allocated. It
	// costs a runtime.Callers per Allocate (a few hundred ns, more for
	// deep stacks) and an allocation per new call site: fine for tests
	// and debugging sessions, worth leaving off in hot production paths.
	// Stacks are symbolized only when printed.
	CaptureStacks bool

	// OnOutOfMemory, if set, is called when the upstream fails an
	// allocation with an error matching cuda.ErrorOutOfMemory, with the
	// Tracking, the size asked for and the error (which Allocate then
	// returns unchanged). It runs on the allocating goroutine with no lock
	// of the Tracking held, so it may block and call the Tracking; if it
	// panics, the panic goes on to the caller of Allocate. Put the
	// Tracking above any retrying or fallback adaptor, so that the hook
	// sees only the failures nothing below recovers from: what is live
	// then filled the memory (gpuprof.WriteOnOutOfMemory profiles it).
	OnOutOfMemory func(t *Tracking, size uint64, err error)
}

// Allocation is one live allocation seen by a Tracking resource.
type Allocation struct {
	Ptr    cuda.DevicePtr
	Size   uint64
	Stream *cuda.Stream // the stream the buffer was allocated on
	Time   time.Time    // when Allocate returned it
	// Callers holds the program counters of the allocating goroutine's
	// stack, innermost first, as runtime.Callers gives them, when
	// CaptureStacks is on; nil otherwise. Stack formats them.
	Callers []uintptr
}

// Stack formats the allocation's call stack, one "function\n\tfile:line"
// entry per frame, from the first frame past cudamem's allocation path
// (the frames of package resource, buffer and the timeline's Recorder on
// top say nothing about the allocation site); "" when no stack was
// captured.
func (a Allocation) Stack() string {
	var sb strings.Builder
	writeStack(&sb, a.Callers, "")
	return sb.String()
}

// trackRecord is what the live map holds per address.
type trackRecord struct {
	size    uint64
	stream  *cuda.Stream
	time    time.Time
	callers []uintptr
}

// Tracking keeps a record of every live allocation made through it:
// address, size, stream, time and, with CaptureStacks, the allocating
// call stack. It answers "what is still allocated, and who allocated
// it": tests assert that LiveCount is 0 when they end and print Report
// when it is not, as RMM's tracking_resource_adaptor is used.
//
// Because it knows what is live, Tracking refuses frees of memory it did
// not hand out or already freed (a double free), and frees with the wrong
// size, with an error matching cuda.ErrInvalidArgument, and does not pass
// them on: a pool below may have handed the address out again, and would
// free the new owner's memory. (A double free after the address was
// reallocated through this same Tracking looks like a valid free.)
//
// The record is a map under a mutex: cheap next to a driver call, but a
// point of contention for many goroutines allocating at once. Buffers
// from Allocate are owned by the Tracking, so that their Close ends the
// record. Tracking is safe for concurrent use.
type Tracking struct {
	up     buffer.MemoryResource
	stacks bool
	onOOM  func(*Tracking, uint64, error)

	mu    sync.Mutex
	live  map[cuda.DevicePtr]trackRecord
	bytes uint64
	// sites counts every allocation since the Tracking was made, by call
	// stack (the zero key without CaptureStacks). A site's callers are
	// shared with the live records made there: a repeated call site costs
	// no allocation.
	sites map[trackSiteKey]*AllocationSite
}

// trackSiteKey is a call stack as a map key: the frames, zero-padded.
type trackSiteKey [frames.Depth]uintptr

// AllocationSite is one allocation call stack's totals since the
// Tracking was made, freed allocations included.
type AllocationSite struct {
	// Callers is the stack, innermost first, as Allocation.Callers; nil
	// without CaptureStacks (then one site holds every allocation). It is
	// shared with the record: do not modify it.
	Callers []uintptr
	// Count and Bytes are the allocations made at this site and their
	// bytes (saturating at the largest uint64).
	Count, Bytes uint64
}

var _ buffer.MemoryResource = (*Tracking)(nil)

// NewTracking returns a resource that allocates from upstream and records
// the live allocations. opts may be nil. A nil upstream makes every
// Allocate fail with an error matching cuda.ErrInvalidArgument.
func NewTracking(upstream buffer.MemoryResource, opts *TrackingOptions) *Tracking {
	r := &Tracking{up: adaptorUpstream(upstream), live: make(map[cuda.DevicePtr]trackRecord), sites: make(map[trackSiteKey]*AllocationSite)}
	if opts != nil {
		r.stacks, r.onOOM = opts.CaptureStacks, opts.OnOutOfMemory
	}
	return r
}

// Allocate allocates from the upstream and records the allocation.
// Upstream errors are returned unchanged.
func (r *Tracking) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address (0 for size 0) and the stream the upstream ordered it on,
// recorded as live. Free it with Deallocate.
func (r *Tracking) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if r == nil || r.up == nil || r.live == nil || r.sites == nil {
		return 0, nil, errNoUpstream("Tracking", "Allocate")
	}
	var key trackSiteKey
	n := 0
	if r.stacks {
		n = runtime.Callers(2, key[:]) // skip runtime.Callers and this method
	}
	ptr, us, err := r.up.AllocatePtr(size, s)
	if err != nil {
		if r.onOOM != nil && errors.Is(err, cuda.ErrorOutOfMemory) {
			r.onOOM(r, size, err)
		}
		return 0, nil, err
	}
	if ptr != 0 { // an empty allocation owns nothing and is never deallocated
		rec := trackRecord{size: size, stream: us, time: time.Now()}
		r.mu.Lock()
		site := r.sites[key]
		if site == nil {
			site = &AllocationSite{}
			if n > 0 {
				site.Callers = slices.Clone(key[:n])
			}
			r.sites[key] = site
		}
		site.Count++
		site.Bytes = satAdd(site.Bytes, size)
		rec.callers = site.Callers
		if old, ok := r.live[ptr]; ok {
			// Freed behind our back (through the upstream directly): the
			// new record replaces the stale one.
			r.bytes -= min(r.bytes, old.size)
		}
		r.live[ptr] = rec
		r.bytes = satAdd(r.bytes, size)
		r.mu.Unlock()
	}
	return ptr, us, nil
}

// Deallocate frees a live allocation through the upstream. A ptr that is
// not live here, or a size that differs from the allocation's, is refused
// with an error matching cuda.ErrInvalidArgument without calling the
// upstream. If the upstream fails, the allocation stays live (the
// buffer's Close may be retried). A zero ptr does nothing.
func (r *Tracking) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if r == nil || r.up == nil || r.live == nil {
		return errNoUpstream("Tracking", "Deallocate")
	}
	r.mu.Lock()
	rec, ok := r.live[ptr]
	if !ok || rec.size != size {
		r.mu.Unlock()
		if !ok {
			return cuda.Errorf("Tracking.Deallocate", cuda.ErrInvalidArgument, "%#x (%d bytes) is not a live allocation of this resource (freed twice, or allocated elsewhere)", uint64(ptr), size)
		}
		return cuda.Errorf("Tracking.Deallocate", cuda.ErrInvalidArgument, "%#x freed with size %d, allocated with %d", uint64(ptr), size, rec.size)
	}
	// Off the books before the upstream frees it, so a racing second free
	// of the same address is refused rather than forwarded, and so the
	// record is gone before the upstream can hand the address out again.
	delete(r.live, ptr)
	r.bytes -= min(r.bytes, size)
	r.mu.Unlock()
	// Not freed (the upstream failed, or panicked: it may be user code):
	// back on the books, for a retry.
	freed := false
	defer func() {
		if !freed {
			r.mu.Lock()
			r.live[ptr] = rec
			r.bytes = satAdd(r.bytes, size)
			r.mu.Unlock()
		}
	}()
	freed, err := freeThrough(r.up, ptr, size, s)
	return err
}

// Live returns the live allocations sorted by address (nil if none).
// Their Callers slices are shared with the record: do not modify them.
func (r *Tracking) Live() []Allocation {
	_, live := r.Snapshot()
	return live
}

// Sites returns the allocation totals per call stack since the Tracking
// was made (freed allocations included), largest Bytes first; nil if
// nothing was allocated. Without CaptureStacks there is one site, with
// nil Callers. Live gives what is still allocated.
func (r *Tracking) Sites() []AllocationSite {
	sites, _ := r.Snapshot()
	return sites
}

// Snapshot returns Sites and Live as of one moment (under one hold of
// the lock): every live allocation is among its site's totals, which two
// separate calls racing other goroutines' allocations do not promise.
func (r *Tracking) Snapshot() (sites []AllocationSite, live []Allocation) {
	if r == nil {
		return nil, nil
	}
	r.mu.Lock()
	for _, st := range r.sites {
		sites = append(sites, *st)
	}
	for p, rec := range r.live {
		live = append(live, Allocation{Ptr: p, Size: rec.size, Stream: rec.stream, Time: rec.time, Callers: rec.callers})
	}
	r.mu.Unlock()
	slices.SortFunc(sites, func(a, b AllocationSite) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(b.Count, a.Count), slices.Compare(a.Callers, b.Callers))
	})
	slices.SortFunc(live, func(a, b Allocation) int { return cmp.Compare(a.Ptr, b.Ptr) })
	return sites, live
}

// LiveBytes is the sum of the sizes of the live allocations.
func (r *Tracking) LiveBytes() uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes
}

// LiveCount is the number of live allocations.
func (r *Tracking) LiveCount() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// reportListMax is how many allocations Report lists per site.
const reportListMax = 8

// Report describes the live allocations for a human reading a leak: a
// summary line, then one section per allocation site (identical call
// stacks), largest first, each with its allocations (the first few, by
// address) and its stack. Without CaptureStacks all allocations form one
// section.
func (r *Tracking) Report() string {
	live := r.Live()
	if len(live) == 0 {
		return "Tracking: no live allocations\n"
	}
	type site struct {
		bytes  uint64
		allocs []Allocation
	}
	sites := map[string]*site{}
	var total uint64
	for _, a := range live {
		total = satAdd(total, a.Size)
		k := frames.Key(a.Callers)
		st := sites[k]
		if st == nil {
			st = &site{}
			sites[k] = st
		}
		st.bytes = satAdd(st.bytes, a.Size)
		st.allocs = append(st.allocs, a)
	}
	order := slices.SortedFunc(maps.Values(sites), func(a, b *site) int {
		return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(len(b.allocs), len(a.allocs)), cmp.Compare(a.allocs[0].Ptr, b.allocs[0].Ptr))
	})

	var sb strings.Builder
	now := time.Now()
	fmt.Fprintf(&sb, "Tracking: %d live allocations, %d bytes, from %d sites\n", len(live), total, len(order))
	for _, st := range order {
		fmt.Fprintf(&sb, "\n%d allocations, %d bytes", len(st.allocs), st.bytes)
		if st.allocs[0].Callers == nil {
			sb.WriteString(" (allocation site unknown: CaptureStacks is off)\n")
		} else {
			sb.WriteString(", allocated at:\n")
			writeStack(&sb, st.allocs[0].Callers, "\t")
		}
		for i, a := range st.allocs {
			if i == reportListMax {
				fmt.Fprintf(&sb, "\t... and %d more\n", len(st.allocs)-i)
				break
			}
			fmt.Fprintf(&sb, "\t%#x: %d bytes, stream %#x, %v ago\n", uint64(a.Ptr), a.Size, a.Stream.Handle(), now.Sub(a.Time).Round(time.Microsecond))
		}
	}
	return sb.String()
}

// satAdd is a+b, stopping at the largest uint64 rather than wrapping: the
// sum of live sizes (LiveBytes, Report) of allocations whose sizes come
// from callers must not wrap to a small number.
func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// writeStack writes the allocation site of pcs ([frames.Site]), each line
// prefixed with indent.
func writeStack(sb *strings.Builder, pcs []uintptr, indent string) {
	for f := range frames.Site(pcs) {
		fmt.Fprintf(sb, "%s%s\n%s\t%s:%d\n", indent, f.Function, indent, f.File, f.Line)
	}
}

// Upstream is the resource r allocates from (nil if none).
func (r *Tracking) Upstream() buffer.MemoryResource {
	if r == nil {
		return nil
	}
	return r.up
}

// DeviceAccessible, HostAccessible and DeviceID answer for the upstream.
func (r *Tracking) DeviceAccessible() bool { return upDeviceAccessible(r.Upstream()) }
func (r *Tracking) HostAccessible() bool   { return upHostAccessible(r.Upstream()) }
func (r *Tracking) DeviceID() int          { return upDeviceID(r.Upstream()) }

// String describes the resource for logs.
func (r *Tracking) String() string {
	if r == nil {
		return "Tracking(nil)"
	}
	n, b := r.LiveCount(), r.LiveBytes()
	return adaptorString("Tracking", r.up, fmt.Sprintf("%d live allocations, %d bytes", n, b))
}
