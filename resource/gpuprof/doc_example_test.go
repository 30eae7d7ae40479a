package gpuprof_test

import (
	"log"
	"net/http"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/gpuprof"
)

// Find where GPU memory goes: track the pool's allocations with their
// stacks, serve them beside net/http/pprof, and write one profile to a
// file. Then: go tool pprof -http=: gpuheap.pb.gz
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	t := resource.NewTracking(pool, &resource.TrackingOptions{CaptureStacks: true})
	http.Handle("/debug/pprof/gpuheap", gpuprof.Handler(t)) // ?debug=1: text

	b, err := t.Allocate(64<<20, nil) // every allocation through t is counted, with its stack
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	if err := gpuprof.WriteFile("gpuheap.pb.gz", t); err != nil {
		log.Fatal(err)
	}
}
