package resource_test

import (
	"fmt"

	"github.com/cudamem/cudamem/resource"
)

// Retrying asks a function what to do after each out-of-memory failure:
// here, free a cache the program can rebuild, and give up after two tries.
func ExampleNewRetrying() {
	up := newRecording() // a fake device; a program passes its pool
	up.fail(1, 0)        // the next allocation fails: out of memory
	mr := resource.NewRetrying(up, func(size uint64, attempt int) bool {
		fmt.Printf("out of memory for %d bytes (attempt %d): dropping a cache\n", size, attempt)
		return attempt < 2
	})
	buf, err := mr.Allocate(1<<20, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Close()
	fmt.Println("allocated after", mr.Retries(), "retry")
	// Output:
	// out of memory for 1048576 bytes (attempt 1): dropping a cache
	// allocated after 1 retry
}

// Fallback takes memory from a second resource (managed memory, say) when
// the first is full, and frees each buffer where it came from.
func ExampleNewFallback() {
	device, managed := newRecording(), newRecording() // fakes; a program passes a pool and resource.Managed
	managed.next = 0x1000_0000_0000
	mr := resource.NewFallback(device, managed)
	device.fail(1, 0) // the device is full for the next allocation
	buf, err := mr.Allocate(1<<20, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("fallbacks:", mr.Fallbacks(), "live:", mr.LiveFallbacks())
	if err := buf.Close(); err != nil {
		fmt.Println(err)
		return
	}
	live, _, _, _, _ := managed.counts()
	fmt.Println("after Close, live in the fallback:", live)
	// Output:
	// fallbacks: 1 live: 1
	// after Close, live in the fallback: 0
}
