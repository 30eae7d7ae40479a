package virtual_test

import (
	"errors"
	"fmt"
	"io"
	"log"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/virtual"
)

// Sharing an allocation across the nodes of an NVLink domain (GB200 NVL72):
// the exporter sends each chunk's bytes over any channel (here w), the
// importer on another node decodes them and maps the memory. On a machine
// without IMEX the export fails with an error matching cuda.ErrNotSupported
// that says so.
func ExampleResource_ExportFabric() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := virtual.New(dev, &virtual.Options{HandleType: virtual.HandleFabric})
	if errors.Is(err, cuda.ErrNotSupported) {
		fmt.Println("no fabric handles here:", err)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	b, err := mr.Allocate(64<<20, nil)
	if err != nil {
		log.Fatal(err) // without IMEX: cuda.ErrNotSupported, naming IMEX
	}
	defer b.Close() // keep it open until the importers are done
	chunks, err := mr.ExportFabric(b)
	if err != nil {
		log.Fatal(err)
	}
	var w io.Writer = io.Discard // a TCP connection, MPI, a key-value store...
	for _, c := range chunks {
		msg, err := c.MarshalBinary() // virtual.FabricChunkSize bytes
		if err != nil {
			log.Fatal(err)
		}
		if _, err := w.Write(msg); err != nil {
			log.Fatal(err)
		}
	}
	// On the other node, for each virtual.FabricChunkSize bytes received:
	//	var c virtual.FabricChunk
	//	err := c.UnmarshalBinary(msg)        // refuses corrupted bytes
	//	...
	//	b, err := mr.ImportFabric(chunks, size) // the driver refuses unknown handles
}

// Allocations NCCL can register as user buffers: ncclMemAlloc's properties
// (POSIX fd handles, plus fabric where IMEX works; GPUDirect RDMA where the
// device supports it with VMM; the recommended granularity).
func ExampleNCCLOptions() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	opts, err := virtual.NCCLOptions(dev)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := virtual.New(dev, opts)
	if err != nil {
		log.Fatal(err)
	}
	b, err := mr.Allocate(256<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	p, err := mr.AllocationProperties(b)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("handle types %#x, GPUDirect RDMA %d\n", p.RequestedHandleTypes, p.AllocFlags.GPUDirectRDMACapable)
	// Hand b.Ptr() and b.Size() to ncclCommRegister through an NCCL binding.
}

// A chunk's encoding is checked when decoded: bytes that are not one are
// refused before anything reaches the driver.
func ExampleFabricChunk_UnmarshalBinary() {
	var c virtual.FabricChunk
	err := c.UnmarshalBinary(make([]byte, virtual.FabricChunkSize))
	fmt.Println(errors.Is(err, cuda.ErrInvalidArgument))
	err = c.UnmarshalBinary([]byte("short"))
	fmt.Println(errors.Is(err, cuda.ErrInvalidArgument))
	// Output:
	// true
	// true
}
