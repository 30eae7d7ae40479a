package dlpack_test

import (
	"fmt"
	"log"
	"unsafe"

	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
	"github.com/cudamem/cudamem/resource"
)

// Hand a device buffer to a C library loaded at run time. The library
// (libconsumer.so here, a stand-in) takes the tensor and calls its
// deleter when done, from any thread; the buffer's memory stays
// allocated until then, even across Close.
func ExampleExport() {
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
	defer b.Close() // returns nil at once; the memory outlives it until the deleter runs

	t, err := dlpack.Export(b)
	if err != nil {
		log.Fatal(err)
	}
	lib, err := loader.OpenLibrary("libconsumer.so")
	if err != nil {
		dlpack.Delete(uintptr(unsafe.Pointer(t))) // not handed over: give it back
		log.Fatal(err)
	}
	consume, err := lib.Lookup("consume_tensor") // int consume_tensor(DLManagedTensorVersioned *)
	if err != nil {
		dlpack.Delete(uintptr(unsafe.Pointer(t)))
		log.Fatal(err)
	}
	if r := consume.Call(uintptr(unsafe.Pointer(t))); r != 0 {
		log.Fatalf("consume_tensor: %d", r)
	}
}

// Take a tensor a C library produced, use it as a Buffer, and give it back
// (the producer's deleter runs at Close).
func ExampleImport() {
	lib, err := loader.OpenLibrary("libproducer.so") // a stand-in
	if err != nil {
		log.Fatal(err)
	}
	produce, err := lib.Lookup("produce_tensor") // DLManagedTensorVersioned *produce_tensor(void)
	if err != nil {
		log.Fatal(err)
	}
	p := produce.Call()
	b, err := dlpack.Import(p, dlpack.ExpectDevice(dlpack.Device{Type: dlpack.CUDA, ID: 0}))
	if err != nil {
		dlpack.Delete(p) // a refused tensor is still ours to give back
		log.Fatal(err)
	}
	defer b.Close() // calls the producer's deleter
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if err := b.Fill8(0, s); err != nil { // stream-ordered, like any Buffer
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil { // done before the deleter hands the memory back
		log.Fatal(err)
	}
	fmt.Println(b.Size())
}

// DeviceOf tells where a buffer's memory is, as a DLPack consumer will see
// it. Without a driver the example prints the error's sentinel.
func ExampleDeviceOf() {
	pinned, err := resource.NewLegacyPinned()
	if err != nil {
		fmt.Println("no driver:", err != nil)
		return
	}
	b, err := pinned.Allocate(4096, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	d, err := dlpack.DeviceOf(b)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d)
}
