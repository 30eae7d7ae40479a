// Package gpuprof writes the allocations of a resource.Tracking as pprof
// profiles, so that `go tool pprof` answers "where did my GPU memory go?"
// the way it answers it for the Go heap: by allocating call stack, as a
// flame graph, top list or source view.
//
// A profile has four sample types, as a Go heap profile does:
// inuse_space and inuse_objects (the live allocations, the default view)
// and alloc_space and alloc_objects (every allocation since the Tracking
// was made). Stacks come from TrackingOptions.CaptureStacks; without it
// every allocation is in one sample with no stack. The frames of
// cudamem's allocation path on top of each stack (package resource, the
// timeline's Recorder, package buffer) are left out; below the top they
// stay. A profile is one snapshot of the Tracking: nothing shows more in
// use than was allocated at its site.
//
//	t := resource.NewTracking(pool, &resource.TrackingOptions{CaptureStacks: true})
//	http.Handle("/debug/pprof/gpuheap", gpuprof.Handler(t))
//	// go tool pprof -http=: http://host/debug/pprof/gpuheap
//
// Unlike the Go heap profile, nothing is sampled: every allocation is
// counted, with its exact size.
package gpuprof
