package timeline

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/frames"
)

// Kind is what an event records.
type Kind uint8

const (
	// Alloc is a successful allocation.
	Alloc Kind = iota + 1
	// Free is a deallocation, recorded before the upstream frees (so that
	// the address cannot be handed out again, and recorded, first).
	Free
	// Sleep is memory put to sleep (virtual.Resource.Sleep): its physical
	// memory released, its address kept. Duration is the call's.
	Sleep
	// Wake is sleeping memory woken (virtual.Resource.Wake).
	Wake
)

var kindNames = [...]string{Alloc: "alloc", Free: "free", Sleep: "sleep", Wake: "wake"}

func (k Kind) valid() bool { return k >= Alloc && int(k) < len(kindNames) }

// String is "alloc", "free", "sleep" or "wake".
func (k Kind) String() string {
	if k.valid() {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MarshalText writes the kind as in String; an unknown kind is an error.
func (k Kind) MarshalText() ([]byte, error) {
	if !k.valid() {
		return nil, cuda.Errorf("Kind.MarshalText", cuda.ErrInvalidArgument, "unknown event kind %d", uint8(k))
	}
	return []byte(k.String()), nil
}

// UnmarshalText reads "alloc" or "free".
func (k *Kind) UnmarshalText(b []byte) error {
	if k == nil {
		return cuda.Errorf("Kind.UnmarshalText", cuda.ErrInvalidArgument, "nil *Kind")
	}
	for i, name := range kindNames {
		if name != "" && name == string(b) {
			*k = Kind(i)
			return nil
		}
	}
	return cuda.Errorf("Kind.UnmarshalText", cuda.ErrInvalidArgument, "unknown event kind %q (want alloc, free, sleep or wake)", b)
}

// Event is one allocation or free seen by a Recorder, or a sleep or wake
// of virtual memory.
type Event struct {
	// Seq numbers the events of a Log from 1, in the order they were
	// recorded; it keeps counting when old events are dropped.
	Seq uint64 `json:"seq"`
	// Time is when the event was recorded, since the Log's start.
	Time time.Duration `json:"t_ns"`
	Kind Kind          `json:"kind"`
	// Addr and Size are the allocation's address and size in bytes.
	Addr uint64 `json:"addr"`
	Size uint64 `json:"size"`
	// Stream is the CUstream handle (0 for the legacy default stream).
	Stream uint64 `json:"stream"`
	// Device is the resource's DeviceID (-1 for host memory).
	Device int `json:"device"`
	// Resource names the Recorder that saw the event.
	Resource string `json:"resource"`
	// Tag and Duration are a Sleep's or Wake's: the memory's tag and the
	// time the call took.
	Tag      string        `json:"tag,omitempty"`
	Duration time.Duration `json:"dur_ns,omitempty"`
	// Stack is the call stack from the call site, innermost first, one
	// "function file:line" per frame (cudamem's own frames on top left
	// out); empty unless the Recorder captures stacks.
	Stack []string `json:"stack,omitempty"`
}

// DefaultCapacity is the number of events a Log keeps when made with a
// capacity of 0 (or as a zero value).
const DefaultCapacity = 1 << 16

// entry is an event in the ring: program counters, not symbols.
type entry struct {
	Event
	callers []uintptr
}

type liveKey struct {
	resource string
	addr     uint64
}

// Log is a bounded ring of events shared by any number of Recorders:
// when it is full, each new event drops the oldest (Dropped counts them).
// An allocation whose Alloc event was dropped while its Free is not, or
// has not happened, is kept aside (one entry per allocation), so that the
// numbers of a trace stay exact however many events were dropped.
// Recording an event costs a clock reading and the Log's mutex: a few
// hundred nanoseconds. The zero value is an empty Log of DefaultCapacity,
// its clock starting at the first event. Log is safe for concurrent use.
type Log struct {
	mu      sync.Mutex
	start   time.Time
	cap     int
	ring    []entry // grows to cap, then wraps
	head    int     // index of the oldest entry once the ring is full
	seq     uint64
	dropped uint64
	carried map[liveKey]entry // allocations whose Alloc was dropped, Free not yet
}

// NewLog returns an empty Log keeping the last capacity events (0 or
// less means DefaultCapacity). Its clock starts now.
func NewLog(capacity int) *Log {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Log{cap: capacity, start: time.Now()}
}

func (l *Log) capacity() int {
	if l.cap <= 0 {
		return DefaultCapacity
	}
	return l.cap
}

// Capacity is the number of events the Log keeps (0 for nil).
func (l *Log) Capacity() int {
	if l == nil {
		return 0
	}
	return l.capacity()
}

// Len is the number of events in the Log now.
func (l *Log) Len() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ring)
}

// Dropped is the number of events dropped to make room.
func (l *Log) Dropped() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

// Reset empties the Log, forgets what was live and restarts its clock
// and sequence numbers.
func (l *Log) Reset() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring, l.head, l.seq, l.dropped, l.carried = nil, 0, 0, 0, nil
	l.start = time.Now()
}

// Record adds e to the Log, numbered and timed by it (Seq and Time are
// set here), as Recorders do for allocations and frees;
// virtual.Resource records its sleeps and wakes with it
// (virtual.Options.Timeline). An unknown Kind is an error matching
// cuda.ErrInvalidArgument.
func (l *Log) Record(e Event) error {
	if l == nil {
		return cuda.Errorf("Log.Record", cuda.ErrInvalidArgument, "nil Log")
	}
	if !e.Kind.valid() {
		return cuda.Errorf("Log.Record", cuda.ErrInvalidArgument, "unknown event kind %d", uint8(e.Kind))
	}
	l.record(e, nil)
	return nil
}

// record appends an event, dropping the oldest when full.
func (l *Log) record(e Event, callers []uintptr) {
	now := time.Now()
	l.mu.Lock()
	if l.start.IsZero() {
		l.start = now
	}
	l.seq++
	e.Seq = l.seq
	e.Time = max(now.Sub(l.start), 0)
	// Times follow Seq, whoever read the clock first.
	if n := len(l.ring); n > 0 {
		e.Time = max(e.Time, l.ring[(l.head+n-1)%n].Time) // the newest entry
	}
	if len(l.ring) < l.capacity() {
		l.ring = append(l.ring, entry{Event: e, callers: callers})
		l.mu.Unlock()
		return
	}
	old := l.ring[l.head]
	l.ring[l.head] = entry{Event: e, callers: callers}
	l.head = (l.head + 1) % len(l.ring)
	l.dropped++
	// The ring is in order, so an Alloc leaves before its Free: keep it
	// until its Free leaves too.
	k := liveKey{old.Resource, old.Addr}
	switch old.Kind {
	case Alloc:
		if l.carried == nil {
			l.carried = make(map[liveKey]entry)
		}
		l.carried[k] = old
	case Free:
		delete(l.carried, k)
	}
	l.mu.Unlock()
}

// Trace returns a copy of the Log's events, oldest first, with stacks
// symbolized (an empty Trace for nil).
func (l *Log) Trace() *Trace {
	t := &Trace{Version: TraceVersion}
	if l == nil {
		return t
	}
	l.mu.Lock()
	t.Start, t.Capacity, t.Dropped = l.start, l.capacity(), l.dropped
	ents := make([]entry, 0, len(l.ring))
	ents = append(ents, l.ring[l.head:]...)
	ents = append(ents, l.ring[:l.head]...)
	before := make([]entry, 0, len(l.carried))
	for _, e := range l.carried {
		before = append(before, e)
	}
	l.mu.Unlock()

	slices.SortFunc(before, func(a, b entry) int { return cmp.Compare(a.Seq, b.Seq) })
	sym := symbolizer{}
	for _, e := range before {
		e.Stack = sym.stack(e.callers)
		t.Before = append(t.Before, e.Event)
	}
	t.Events = make([]Event, len(ents))
	for i, e := range ents {
		e.Stack = sym.stack(e.callers)
		t.Events[i] = e.Event
	}
	return t
}

// symbolizer formats program counters, once per distinct frame (inlined
// frames share a pc, so the function is part of the key).
type symbolizer map[frameKey]string

type frameKey struct {
	pc uintptr
	fn string
}

func (s symbolizer) stack(pcs []uintptr) []string {
	var out []string
	for f := range frames.Site(pcs) {
		k := frameKey{f.PC, f.Function}
		line, ok := s[k]
		if !ok {
			line = fmt.Sprintf("%s %s:%d", f.Function, f.File, f.Line)
			s[k] = line
		}
		out = append(out, line)
	}
	return out
}
