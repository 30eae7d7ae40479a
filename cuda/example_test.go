package cuda_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cudamem/cudamem/cuda"
)

// List the devices and what their memory supports.
func ExampleDevices() {
	devs, err := cuda.Devices()
	if errors.Is(err, cuda.ErrNoDriver) {
		fmt.Println("no CUDA driver on this machine")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range devs {
		name, _ := d.Name()
		f, _ := d.Features()
		fmt.Printf("%v: %s, memory pools %v, virtual memory %v\n", d, name, f.MemoryPools, f.VirtualMemory)
	}
}

// Allocate from the device's pool on a stream, fill and free, all ordered
// on the stream; no OS-thread locking is needed.
func ExampleStream_MemAllocFromPoolAsync() {
	d, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	pool, err := d.DefaultMemPool()
	if err != nil {
		log.Fatal(err)
	}
	p, err := s.MemAllocFromPoolAsync(pool, 1<<20)
	if err != nil {
		log.Fatal(err)
	}
	if err := s.MemsetD32Async(p, 42, (1<<20)/4); err != nil {
		log.Fatal(err)
	}
	if err := s.MemFreeAsync(p); err != nil {
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
}

// Match driver errors with errors.Is, through any wrapping.
func ExampleResult() {
	err := fmt.Errorf("allocating scratch: %w", &cuda.OpError{Op: "cuMemAlloc", Err: cuda.ErrorOutOfMemory})
	fmt.Println(errors.Is(err, cuda.ErrorOutOfMemory))
	fmt.Println(err)
	// Output:
	// true
	// allocating scratch: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY
}
