package cuda_test

import (
	"log"

	"github.com/cudamem/cudamem/cuda"
)

// Capture work on a stream into a graph, then launch it repeatedly.
func ExampleStream_BeginCapture() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	p, err := s.MemAllocAsync(4096)
	if err != nil {
		log.Fatal(err)
	}
	defer s.MemFreeAsync(p)

	if err := s.BeginCapture(); err != nil { // relaxed mode
		log.Fatal(err)
	}
	_ = s.MemsetD32Async(p, 7, 1024) // recorded, not run
	g, err := s.EndCapture()
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	e, err := g.Instantiate(0)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	for range 10 {
		if err := e.Launch(s); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
}
