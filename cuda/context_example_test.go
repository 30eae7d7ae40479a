package cuda_test

import (
	"fmt"
	"log"

	"github.com/cudamem/cudamem/cuda"
)

// Create a context of cudamem's own on GPU 0 and work in it: every object
// made from its view (streams here; resources, buffers and kernels alike)
// runs with that context current. Close destroys the context. (Needs a
// GPU; compiled, not run.)
func ExampleDevice_NewContext() {
	d, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	c, err := d.NewContext(cuda.ContextSchedBlockingSync)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close() // after everything made in it
	v := c.Device()
	s, err := v.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	pool, err := v.DefaultMemPool() // pools belong to the GPU
	if err != nil {
		log.Fatal(err)
	}
	p, err := s.MemAllocFromPoolAsync(pool, 1<<20)
	if err != nil {
		log.Fatal(err)
	}
	if err := s.MemFreeAsync(p); err != nil {
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(v, "primary:", v.IsPrimary())
}

// Adopt a context and a stream that another library made (a framework's
// CUcontext and CUstream, as uintptr handles): cudamem makes the context
// current for its own calls and never destroys either. (Needs a GPU and
// the other library's handles; compiled, not run.)
func ExampleWrapContext() {
	var ctxHandle, streamHandle uintptr // from the other library
	v, err := cuda.WrapContext(ctxHandle)
	if err != nil {
		log.Fatal(err)
	}
	s, err := v.WrapStream(streamHandle) // refused if of another context
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close() // ends its use here only
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(v.Primary(), v.SameGPU(v.Primary()))
}
