package timeline_test

import (
	"bytes"
	"fmt"
	"log"
	"os"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/timeline"
)

// Record allocations, read back what was live after each event, and sum
// up the allocations the trace holds.
func ExampleRecorder() {
	// The upstream hands out made-up addresses, so the example runs
	// without a GPU; a program would record a device pool
	// (resource.CurrentDevicePool).
	events := timeline.NewLog(0)
	mr := timeline.NewRecorder(&testutil.MadeUp{}, events, &timeline.RecorderOptions{Name: "scratch"})
	a, _ := mr.Allocate(3<<20, nil)
	b, _ := mr.Allocate(1<<20, nil)
	a.Close()
	b.Close()

	tr := events.Trace()
	for _, e := range tr.Events {
		fmt.Printf("event %d: %s %d bytes at %#x (%s)\n", e.Seq, e.Kind, e.Size, e.Addr, e.Resource)
	}
	for _, u := range tr.Usage("scratch") {
		fmt.Printf("after event %d: %d bytes in %d allocations\n", u.Seq, u.Bytes, u.Count)
	}
	fmt.Println(len(tr.Allocations()), "allocations")
	// Output:
	// event 1: alloc 3145728 bytes at 0x7f0000000000 (scratch)
	// event 2: alloc 1048576 bytes at 0x7f0000300000 (scratch)
	// event 3: free 3145728 bytes at 0x7f0000000000 (scratch)
	// event 4: free 1048576 bytes at 0x7f0000300000 (scratch)
	// after event 0: 0 bytes in 0 allocations
	// after event 1: 3145728 bytes in 1 allocations
	// after event 2: 4194304 bytes in 2 allocations
	// after event 3: 1048576 bytes in 1 allocations
	// after event 4: 0 bytes in 0 allocations
	// 2 allocations
}

// Dump a trace as JSON and read it back: a program writes it, a tool
// (cudamem timeline -in) draws it later.
func ExampleReadJSON() {
	mr := timeline.NewRecorder(&testutil.MadeUp{}, nil, &timeline.RecorderOptions{Name: "pool"})
	buf, _ := mr.Allocate(4096, nil)
	defer buf.Close()

	var dump bytes.Buffer
	if err := mr.Log().Trace().WriteJSON(&dump); err != nil {
		log.Fatal(err)
	}
	tr, err := timeline.ReadJSON(&dump)
	if err != nil {
		log.Fatal(err)
	}
	e := tr.Events[0]
	fmt.Println(e.Kind, e.Size, e.Resource)
	// Output:
	// alloc 4096 pool
}

// On a GPU: record the upstream blocks of a sub-allocator and the
// allocations carved from them in one Log, and dump the trace: `cudamem
// timeline -in trace.json` draws both, with the blocks' used and free
// ranges at the peak. (Needs a GPU, so it has no Output.)
func ExampleRecorder_subAllocator() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	events := timeline.NewLog(0)
	blocks := timeline.NewRecorder(pool, events, &timeline.RecorderOptions{Name: "pool"})
	sub, err := resource.NewSubAllocator(blocks, &resource.SubAllocatorOptions{GrowSize: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	mr := timeline.NewRecorder(sub, events, &timeline.RecorderOptions{Name: "suballocator", CaptureStacks: true})

	var live []*buffer.Buffer
	for i := range 200 {
		b, err := mr.Allocate(uint64(i%17+1)<<16, nil)
		if err != nil {
			log.Fatal(err)
		}
		live = append(live, b)
		if i%3 == 0 {
			live[i/2].Close()
		}
	}
	for _, b := range live {
		b.Close()
	}
	f, err := os.Create("trace.json")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := events.Trace().WriteJSON(f); err != nil {
		log.Fatal(err)
	}
}
