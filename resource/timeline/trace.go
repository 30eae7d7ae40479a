package timeline

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cudamem/cudamem/cuda"
)

// TraceVersion is the version of the JSON form that WriteJSON writes and
// ReadJSON reads.
const TraceVersion = 1

// Trace is a copy of a Log's contents: the events in its window, oldest
// first, and the allocations live when the window starts whose Alloc
// events were dropped. It is what WriteJSON writes and ReadJSON reads,
// and what `cudamem timeline -in` draws.
type Trace struct {
	Version int `json:"version"`
	// Start is the wall-clock time of the Log's clock origin (the zero
	// time for an empty zero-value Log).
	Start time.Time `json:"start"`
	// Capacity and Dropped are the Log's: Dropped events made room for
	// newer ones.
	Capacity int    `json:"capacity"`
	Dropped  uint64 `json:"dropped"`
	// Before holds the Alloc events of allocations made before the
	// window whose Free is in the window or has not happened yet.
	Before []Event `json:"before,omitempty"`
	Events []Event `json:"events"`
}

// WriteJSON writes the trace as one JSON object (see the package
// documentation for its fields). A nil Trace writes an empty one.
func (t *Trace) WriteJSON(w io.Writer) error {
	if w == nil {
		return cuda.Errorf("Trace.WriteJSON", cuda.ErrInvalidArgument, "nil writer")
	}
	var out Trace
	if t != nil {
		out = *t
	}
	out.Version = TraceVersion
	if out.Events == nil {
		out.Events = []Event{}
	}
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		return &cuda.OpError{Op: "Trace.WriteJSON", Err: err}
	}
	return nil
}

// ReadJSON reads a trace written by WriteJSON and checks it: the version,
// no unknown fields, event kinds, sequence numbers that increase and
// times that do not go back. Errors match cuda.ErrInvalidArgument.
func ReadJSON(r io.Reader) (*Trace, error) {
	const op = "timeline.ReadJSON"
	if r == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil reader")
	}
	var t Trace
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v", err)
	}
	if t.Version != TraceVersion {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "trace version %d; this reader knows version %d", t.Version, TraceVersion)
	}
	if err := t.check(); err != nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v", err)
	}
	return &t, nil
}

func (t *Trace) check() error {
	seen := map[liveKey]bool{}
	for i, e := range t.Before {
		k := liveKey{e.Resource, e.Addr}
		switch {
		case e.Kind != Alloc:
			return fmt.Errorf("before[%d] is not an alloc event", i)
		case seen[k]:
			return fmt.Errorf("before[%d]: a second allocation at %#x of %q", i, e.Addr, e.Resource)
		}
		seen[k] = true
	}
	var seq uint64
	var tm time.Duration
	for i, e := range t.Events {
		switch {
		case !e.Kind.valid():
			return fmt.Errorf("events[%d] has no kind", i)
		case i > 0 && e.Seq <= seq:
			return fmt.Errorf("events[%d]: sequence numbers do not increase", i)
		case i > 0 && e.Time < tm:
			return fmt.Errorf("events[%d]: time goes back", i)
		case e.Time < 0:
			return fmt.Errorf("events[%d]: negative time", i)
		}
		seq, tm = e.Seq, e.Time
	}
	return nil
}

// Allocation is one allocation's life in a trace.
type Allocation struct {
	Resource string
	Addr     uint64
	Size     uint64
	Stream   uint64
	Device   int
	// Alloc and Free index Trace.Events: the events that made and ended
	// the allocation. Alloc is -1 for an allocation from Trace.Before
	// (made before the window), Free is -1 for one still live at the end.
	Alloc, Free int
	// AllocSeq is the Seq of the Alloc event (in Events or Before).
	AllocSeq uint64
	// Stack is the Alloc event's stack.
	Stack []string
}

// Allocations pairs the trace's Alloc and Free events by resource and
// address, in the order the allocations were made (those of Before
// first). A Free that matches no allocation (memory the Recorder
// forwarded without having seen it allocated) is left out.
func (t *Trace) Allocations() []Allocation {
	if t == nil {
		return nil
	}
	var out []Allocation
	open := map[liveKey]int{} // live allocations: index into out
	add := func(e Event, idx int) {
		k := liveKey{e.Resource, e.Addr}
		if j, ok := open[k]; ok {
			if idx < 0 {
				// Two at one address before the window: keep the later.
				out[j] = Allocation{}
				out = slices.Delete(out, j, j+1)
				for kk, jj := range open {
					if jj > j {
						open[kk] = jj - 1
					}
				}
			} else {
				// An Alloc over a live address (freed around the
				// recorder) ends the old one.
				out[j].Free = idx
			}
		}
		open[k] = len(out)
		out = append(out, Allocation{
			Resource: e.Resource, Addr: e.Addr, Size: e.Size, Stream: e.Stream, Device: e.Device,
			Alloc: idx, Free: -1, AllocSeq: e.Seq, Stack: e.Stack,
		})
	}
	for _, e := range t.Before {
		add(e, -1)
	}
	for i, e := range t.Events {
		switch e.Kind {
		case Alloc:
			add(e, i)
		case Free:
			k := liveKey{e.Resource, e.Addr}
			if j, ok := open[k]; ok {
				out[j].Free = i
				delete(open, k)
			}
		}
	}
	return out
}

// Usage is what is live after an event.
type Usage struct {
	// Index is the event's index in Trace.Events (-1 for the state at the
	// start of the window), Seq and Time its sequence number and time.
	Index int
	Seq   uint64
	Time  time.Duration
	// Bytes and Count are the bytes and allocations live.
	Bytes, Count uint64
}

// Usage returns the bytes and allocations live through the resource
// named resource ("" included) at the start of the window and after each
// of its events: the numbers a resource.Statistics over the same Recorder
// reports (current bytes and count) at the same moments. TotalUsage gives
// every resource together.
func (t *Trace) Usage(resource string) []Usage {
	return t.usage(func(r string) bool { return r == resource })
}

// TotalUsage is Usage of every resource of the trace together: one entry
// for the start and one per event.
func (t *Trace) TotalUsage() []Usage {
	return t.usage(func(string) bool { return true })
}

func (t *Trace) usage(mine func(resource string) bool) []Usage {
	if t == nil {
		return nil
	}
	allocs := t.Allocations()
	var cur Usage
	cur.Index = -1
	freeAt := map[int]int{} // event index of a free -> allocation
	allocAt := map[int]int{}
	for j, a := range allocs {
		if !mine(a.Resource) {
			continue
		}
		if a.Alloc < 0 {
			cur.Bytes = satAdd(cur.Bytes, a.Size)
			cur.Count++
		} else {
			allocAt[a.Alloc] = j
		}
		if a.Free >= 0 {
			freeAt[a.Free] = j
		}
	}
	out := []Usage{cur}
	for i, e := range t.Events {
		if !mine(e.Resource) {
			continue
		}
		// An Alloc over a live address ends the old allocation and
		// starts a new one at the same event.
		if j, ok := freeAt[i]; ok {
			cur.Bytes -= min(cur.Bytes, allocs[j].Size)
			cur.Count -= min(cur.Count, 1)
		}
		if j, ok := allocAt[i]; ok {
			cur.Bytes = satAdd(cur.Bytes, allocs[j].Size)
			cur.Count++
		}
		cur.Index, cur.Seq, cur.Time = i, e.Seq, e.Time
		out = append(out, cur)
	}
	return out
}

// Resources lists the resource names in the trace, in the order they
// first appear (Before first).
func (t *Trace) Resources() []string {
	if t == nil {
		return nil
	}
	var out []string
	for _, evs := range [][]Event{t.Before, t.Events} {
		for _, e := range evs {
			if !slices.Contains(out, e.Resource) {
				out = append(out, e.Resource)
			}
		}
	}
	return out
}

func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}
