package dlpack_test

import (
	"fmt"
	"log"
	"unsafe"

	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// A tensor out and back: Export describes a buffer for a consumer, here
// this package's own Import, which wraps the tensor in a Buffer whose
// Close calls the deleter, as a C consumer calls it when done. The memory
// stays allocated until then, whichever Close comes first.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	b, err := pool.Allocate(1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	t, err := dlpack.Export(b)
	if err != nil {
		log.Fatal(err)
	}
	p := uintptr(unsafe.Pointer(t)) // what a C consumer is given
	view, err := dlpack.Import(p, dlpack.ExpectDevice(dlpack.Device{Type: dlpack.CUDA, ID: int32(dev.Ordinal())}))
	if err != nil {
		dlpack.Delete(p) // a refused tensor is still ours to give back
		log.Fatal(err)
	}
	fmt.Println(view.Size(), dlpack.Live())
	if err := view.Close(); err != nil { // the consumer is done: the deleter runs
		log.Fatal(err)
	}
	fmt.Println(dlpack.Live())
}
