package timeline

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/cudamem/cudamem/cuda"
)

// chromeEvent is one entry of the Chrome trace-event format's
// traceEvents array (the fields this writer uses).
type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"` // microseconds
	Dur  *float64       `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// WriteChromeTrace writes the trace in the Chrome trace-event JSON format,
// which Perfetto (ui.perfetto.dev) and chrome://tracing load: a process
// per device ("device N", or "host"); a counter track per resource with
// the bytes and allocations live after each of its events, as Trace.Usage
// gives them (a resource named "" is labelled "(unnamed)", or another
// name no resource of the trace has); and a thread per stream holding a
// span per allocation, from its Alloc to its Free (or the trace's end or
// start), with its size, address, resource and stack as args. Times are
// microseconds since the Log's start. A nil Trace writes an empty one.
func (t *Trace) WriteChromeTrace(w io.Writer) error {
	const op = "Trace.WriteChromeTrace"
	if w == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil writer")
	}
	evs := t.chromeEvents()
	out := struct {
		TraceEvents     []chromeEvent `json:"traceEvents"`
		DisplayTimeUnit string        `json:"displayTimeUnit"`
	}{evs, "ns"}
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	return nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func (t *Trace) chromeEvents() []chromeEvent {
	evs := []chromeEvent{}
	if t == nil {
		return evs
	}
	// pid: device+2, so that every pid is positive (host memory's 1). tid:
	// streams numbered from 1 as they appear (handles are too large).
	pids := map[int]bool{}
	type streamKey struct {
		dev    int
		stream uint64
	}
	tids := map[streamKey]int{}
	var meta []chromeEvent
	pidOf := func(dev int) int {
		pid := dev + 2
		if !pids[pid] {
			pids[pid] = true
			name := fmt.Sprintf("device %d", dev)
			if dev < 0 {
				name = "host"
			}
			meta = append(meta, chromeEvent{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": name}})
		}
		return pid
	}
	tidOf := func(dev int, stream uint64) int {
		k := streamKey{dev, stream}
		tid, ok := tids[k]
		if !ok {
			tid = len(tids) + 1
			tids[k] = tid
			meta = append(meta, chromeEvent{Name: "thread_name", Ph: "M", Pid: pidOf(dev), Tid: tid, Args: map[string]any{"name": fmt.Sprintf("stream %#x", stream)}})
		}
		return tid
	}

	sleepTids := map[int]int{}
	sleepTid := func(dev int) int {
		tid, ok := sleepTids[dev]
		if !ok {
			tid = -1 - len(sleepTids) // apart from the streams' (1 up)
			sleepTids[dev] = tid
			meta = append(meta, chromeEvent{Name: "thread_name", Ph: "M", Pid: pidOf(dev), Tid: tid, Args: map[string]any{"name": "sleep and wake"}})
		}
		return tid
	}

	label := resourceLabels(t.Resources())
	var end time.Duration
	if n := len(t.Events); n > 0 {
		end = t.Events[n-1].Time
	}
	for _, a := range t.Allocations() {
		var start time.Duration
		if a.Alloc >= 0 {
			start = t.Events[a.Alloc].Time
		}
		stop := end
		if a.Free >= 0 {
			stop = t.Events[a.Free].Time
		}
		dur := micros(stop - start)
		args := map[string]any{"size": a.Size, "addr": fmt.Sprintf("%#x", a.Addr), "resource": a.Resource, "live_at_end": a.Free < 0}
		if len(a.Stack) > 0 {
			args["stack"] = strings.Join(a.Stack, "\n")
		}
		evs = append(evs, chromeEvent{
			Name: fmt.Sprintf("%s %d B", label[a.Resource], a.Size), Cat: "allocation", Ph: "X",
			Ts: micros(start), Dur: &dur, Pid: pidOf(a.Device), Tid: tidOf(a.Device, a.Stream), Args: args,
		})
	}
	// Sleeps and wakes: a span of the call's time per allocation, on a
	// thread of their own in the device's process.
	for _, e := range t.Events {
		if e.Kind != Sleep && e.Kind != Wake {
			continue
		}
		dur := micros(e.Duration)
		evs = append(evs, chromeEvent{
			Name: fmt.Sprintf("%s %q %d B", e.Kind, e.Tag, e.Size), Cat: e.Kind.String(), Ph: "X",
			Ts: max(micros(e.Time-e.Duration), 0), Dur: &dur, Pid: pidOf(e.Device), Tid: sleepTid(e.Device),
			Args: map[string]any{"size": e.Size, "addr": fmt.Sprintf("%#x", e.Addr), "resource": e.Resource, "tag": e.Tag},
		})
	}
	// A resource's counter lives in the process of its device (the device
	// of its first event), and holds its own usage, whatever its name.
	devOf := map[string]int{}
	for _, evs := range [][]Event{t.Before, t.Events} {
		for _, e := range evs {
			if _, ok := devOf[e.Resource]; !ok {
				devOf[e.Resource] = e.Device
			}
		}
	}
	for _, r := range t.Resources() {
		pid := pidOf(devOf[r])
		for _, u := range t.Usage(r) {
			var ts time.Duration
			if u.Index >= 0 {
				ts = u.Time
			}
			evs = append(evs, chromeEvent{Name: label[r], Cat: "memory", Ph: "C", Ts: micros(ts), Pid: pid, Args: map[string]any{"bytes": u.Bytes, "allocations": u.Count}})
		}
	}
	// In time order, easier to read and diff; stable, so that a counter's
	// events at one time keep their order.
	slices.SortStableFunc(evs, func(a, b chromeEvent) int { return cmp.Compare(a.Ts, b.Ts) })
	return append(append([]chromeEvent{}, meta...), evs...) // [] rather than null when empty
}

// resourceLabels names each resource for a viewer (a Chrome trace's
// counters, the SVG's labels): a viewer needs a name, and tells counters
// apart by it, so a resource named "" gets one no other resource of the
// trace has.
func resourceLabels(resources []string) map[string]string {
	out := make(map[string]string, len(resources))
	for _, r := range resources {
		out[r] = r
	}
	if _, ok := out[""]; ok {
		name := "(unnamed)"
		for i := 2; slices.Contains(resources, name); i++ {
			name = fmt.Sprintf("(unnamed %d)", i)
		}
		out[""] = name
	}
	return out
}
