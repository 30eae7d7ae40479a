package resource_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// Capture a graph whose scratch memory is graph memory: allocated when a
// launch reaches the allocation node, freed at the free node, so the
// device holds it only while a launch runs. Launch it many times.
func ExampleGraphMemory() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	gm, err := resource.NewGraphMemory(dev)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	out, err := pool.Allocate(1<<20, s) // ordinary memory, allocated before the capture
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()

	if err := s.BeginCapture(); err != nil { // relaxed mode: see cuda.CaptureMode
		log.Fatal(err)
	}
	tmp, err := gm.Allocate(1<<20, s) // an allocation node
	if err != nil {
		log.Fatal(err)
	}
	_ = tmp.Fill32(42, s)               // a memset node (kernels would go here too)
	_ = out.CopyFrom(tmp, s)            // a memcpy node
	if err := tmp.Close(); err != nil { // a free node
		log.Fatal(err)
	}
	g, err := s.EndCapture()
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	exec, err := g.Instantiate(0)
	if err != nil {
		log.Fatal(err)
	}
	defer exec.Close()
	for range 100 {
		if err := exec.Launch(s); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
	a, _ := gm.Attributes()
	fmt.Println("graph memory reserved:", a.ReservedCurrent)
	_ = gm.Trim() // give the cached graph memory back
}

// Inside a capture, ordinary resources refuse to allocate, with an error
// matching cuda.ErrCapturing, instead of invalidating the capture.
func ExampleGraphMemory_refusal() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		fmt.Println("no GPU")
		return
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if err := s.BeginCapture(); err != nil {
		log.Fatal(err)
	}
	_, err = pool.Allocate(64, s)
	fmt.Println(errors.Is(err, cuda.ErrCapturing))
	g, err := s.EndCapture() // the capture is still valid
	if err != nil {
		log.Fatal(err)
	}
	g.Close()
}
