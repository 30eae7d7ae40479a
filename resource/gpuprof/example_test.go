package gpuprof_test

import (
	"bytes"
	"fmt"

	"github.com/google/pprof/profile"

	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/gpuprof"
)

//go:noinline
func loadModel(mr *resource.Tracking) error {
	for range 2 {
		if _, _, err := mr.AllocatePtr(64<<20, nil); err != nil {
			return err
		}
	}
	return nil
}

// A profile of the live allocations by stack, parsed back: each sample's
// innermost function and its inuse_objects, inuse_space, alloc_objects
// and alloc_space. Write it to a file (WriteFile) or serve it (Handler)
// and open it with `go tool pprof -http=: gpuheap.pb.gz`.
func ExampleWriteHeapProfile() {
	// A fake upstream, so that the example runs without a GPU; a program
	// tracks its pool: resource.NewTracking(pool, ...).
	mr := resource.NewTracking(newFake(), &resource.TrackingOptions{CaptureStacks: true})
	if err := loadModel(mr); err != nil {
		fmt.Println(err)
		return
	}

	var buf bytes.Buffer
	if err := gpuprof.WriteHeapProfile(&buf, mr); err != nil {
		fmt.Println(err)
		return
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range p.Sample {
		fn := s.Location[0].Line[0].Function.Name
		fmt.Println(fn, s.Value)
	}
	// Output:
	// github.com/cudamem/cudamem/resource/gpuprof_test.loadModel [2 134217728 2 134217728]
}
