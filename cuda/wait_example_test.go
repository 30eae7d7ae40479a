package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/cudamem/cudamem/cuda"
)

// Wait for a stream's work with a deadline: a request handler gives up
// after its budget instead of blocking in the driver, and nothing is left
// waiting on its behalf once the work is done.
func ExampleStream_SyncContext() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	p, err := dev.MemAlloc(1 << 30)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFree(p)
	for range 100 {
		if err := s.MemsetD32Async(p, 7, (1<<30)/4); err != nil {
			log.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	err = s.SyncContext(ctx)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Println("still running; answer later")
	case err != nil:
		log.Fatal(err)
	}
	if err := s.SyncContext(context.Background()); err != nil { // wait for good
		log.Fatal(err)
	}
}
