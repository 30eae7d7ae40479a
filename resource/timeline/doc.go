// Package timeline records where memory goes over time: a Recorder between
// a program and its memory resource logs every allocation and free, and the
// trace it makes is written as JSON (for `cudamem timeline`, which draws it
// as SVG: memory over time, stacked by allocation, and the blocks at one
// moment with their used and free ranges) or as a Chrome trace (for
// chrome://tracing and Perfetto). The package example records a device
// pool and keeps its trace.
//
// A [Recorder] is a memory resource adaptor (a buffer.MemoryResource over
// an upstream, like the adaptors of package resource) that records every
// allocation and free through it in a [Log]: time, size, address,
// stream, device, the recorder's name and, optionally, the call stack.
// The Log is a bounded ring: when full, each new event drops the oldest,
// and Dropped counts them. Allocations whose Alloc event was dropped
// while they were still live are kept aside, one entry each, so that the
// bytes live in what is left of the window stay exact.
//
// [Log.Trace] copies the events out. A [Trace] is written as JSON
// ([Trace.WriteJSON]) and read back ([ReadJSON]), so a program can dump
// its trace and a tool can draw it later, elsewhere (`cudamem timeline
// -in trace.json -o trace.svg`); [Trace.WriteChromeTrace] writes it for a
// trace viewer. [Trace.Allocations] pairs each Alloc with its Free, and
// [Trace.Usage] gives the bytes and allocations live after each event:
// the numbers a resource.Statistics over the same Recorder reports at the
// same moments.
//
// Neither the driver's pools nor resource.SubAllocator expose a map of
// their blocks, so a block view is built from the events: put one
// Recorder below a SubAllocator (it records the upstream blocks) and one
// above (it records the allocations carved out of them), sharing a Log,
// and each block's allocations are the ones inside it.
//
//	events := timeline.NewLog(0)
//	blocks := timeline.NewRecorder(pool, events, &timeline.RecorderOptions{Name: "pool"})
//	sub, err := resource.NewSubAllocator(blocks, nil)
//	...
//	mr := timeline.NewRecorder(sub, events, &timeline.RecorderOptions{Name: "suballocator"})
//	// ... allocate through mr ...
//	err = events.Trace().WriteJSON(f)
//
// # JSON
//
// The JSON form is one object:
//
//	{"version": 1, "start": "2025-01-02T15:04:05.999999999Z", "capacity": 65536, "dropped": 0,
//	 "before": [EVENT...],
//	 "events": [{"seq": 1, "t_ns": 1200, "kind": "alloc", "addr": 139637976727552, "size": 1048576,
//	             "stream": 0, "device": 0, "resource": "pool", "stack": ["main.run /src/main.go:42"]}, ...]}
//
// seq numbers the events from 1 (dropped ones included), t_ns is
// nanoseconds since start, before holds the Alloc events of allocations
// made before the window that the window still sees live or freed.
//
// # Cost
//
// A Recorder costs, per allocate or free, the Log's mutex and a clock
// reading; with CaptureStacks, a runtime.Callers and a small allocation.
// It is a tool for understanding a workload, in a test or a profiling
// run. For always-on numbers use resource.Statistics with package
// resource/metrics, and resource.Logging (nearly free while off).
package timeline
