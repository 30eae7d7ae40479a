package buffer_test

import (
	"fmt"
	"log"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// The examples borrow memory from cuMemAlloc to stay self-contained; owned
// buffers come from the resources of package resource, and are used the
// same way.

// Allocate device memory, copy data in, copy it to a second buffer on the
// device, and read it back.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	const n = 1 << 20
	pa, err := dev.MemAlloc(n)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFree(pa)
	pb, err := dev.MemAlloc(n)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFree(pb)
	a, b := buffer.FromPointer(pa, n), buffer.FromPointer(pb, n)

	in := make([]byte, n)
	for i := range in {
		in[i] = byte(i)
	}
	if err := buffer.CopyFromHost(a, in, s); err != nil {
		log.Fatal(err)
	}
	if err := a.CopyTo(b, s); err != nil { // device to device, ordered after the upload
		log.Fatal(err)
	}
	out := make([]byte, n)
	if err := buffer.CopyToHost(out, b, s); err != nil { // returns once out holds the data
		log.Fatal(err)
	}
	fmt.Println(out[255], out[256])
}

// Copy a []float32 to the device and back; any slice of plain data works.
func ExampleCopyFromHost() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	xs := []float32{0.5, 1.5, 2.5, 3.5}
	p, err := dev.MemAlloc(4 * uint64(len(xs)))
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFree(p)
	b := buffer.FromPointer(p, 4*uint64(len(xs)))

	// A nil stream: the legacy default stream of the buffer's device.
	if err := buffer.CopyFromHost(b, xs, nil); err != nil {
		log.Fatal(err)
	}
	ys := make([]float32, len(xs))
	if err := buffer.CopyToHost(ys, b, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println(ys)
}

// Views address part of a buffer; they never free, and end with it.
func ExampleBuffer_Slice() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	p, err := dev.MemAlloc(4096)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFree(p)
	whole := buffer.FromPointer(p, 4096)

	tail, err := whole.Slice(1024, 3072)
	if err != nil {
		log.Fatal(err)
	}
	if err := buffer.CopyFromHost(tail, make([]uint32, 768), nil); err != nil {
		log.Fatal(err)
	}
	if _, err := whole.Slice(4000, 100); err != nil {
		fmt.Println("out of bounds:", err)
	}
	whole.Close()
	if _, err := tail.Bytes(); err != nil {
		fmt.Println("after Close:", err)
	}
}

// Fill a buffer with a 32-bit pattern, here the bits of a float32.
func ExampleBuffer_Fill32() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	p, err := dev.MemAlloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFree(p)
	b := buffer.FromPointer(p, 1<<20)

	const one = 0x3f800000 // math.Float32bits(1)
	if err := b.Fill32(one, s); err != nil {
		log.Fatal(err)
	}
	first := make([]float32, 1)
	head, _ := b.Slice(0, 4)
	if err := buffer.CopyToHost(first, head, s); err != nil {
		log.Fatal(err)
	}
	fmt.Println(first[0])
}
