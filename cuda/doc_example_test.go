package cuda_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cudamem/cudamem/cuda"
)

// Find the GPUs, tell a machine without a driver from a failure, and make
// a stream: every call works from any goroutine, with no OS-thread
// locking.
func Example() {
	devs, err := cuda.Devices()
	if errors.Is(err, cuda.ErrNoDriver) {
		fmt.Println(err) // names every path tried, and CUDAMEM_DRIVER
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range devs {
		name, err := d.Name()
		if err != nil {
			log.Fatal(err)
		}
		total, err := d.TotalMemory()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%v: %s, %d MiB\n", d, name, total>>20)
	}

	s, err := devs[0].NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	e, err := devs[0].NewEvent(cuda.EventDisableTiming)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	if err := e.Record(s); err != nil { // after the work already on s
		log.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		log.Fatal(err)
	}
}
