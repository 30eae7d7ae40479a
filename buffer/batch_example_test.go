package buffer_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Gather 1,000 records of different sizes from pinned host memory into
// one device buffer in a single batch: one driver call on CUDA 12.8 and
// later drivers instead of 1,000.
func ExampleCopyBatch() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream() // not the legacy default stream: batches need their own
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	const n = 1 << 20
	hp, err := dev.MemHostAlloc(n, cuda.MemHostAllocPortable)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFreeHost(hp)
	dp, err := dev.MemAlloc(n)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.MemFree(dp)
	host := buffer.FromPointer(cuda.DevicePtr(uintptr(hp)), n)
	staged, err := host.Bytes()
	if err != nil {
		log.Fatal(err)
	}
	for i := range staged {
		staged[i] = byte(i)
	}
	dst := buffer.FromPointer(dp, n)

	// Record i is 100+i%400 bytes at offset 1000*i of the host buffer;
	// pack them end to end on the device.
	var copies []buffer.Copy
	var packed uint64
	for i := range uint64(1000) {
		size := 100 + i%400
		copies = append(copies, buffer.Copy{Dst: dst, Src: host, DstOffset: packed, SrcOffset: 1000 * i, Size: size})
		packed += size
	}
	if err := buffer.CopyBatch(s, copies); err != nil {
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d records, %d bytes, through %v\n", len(copies), packed, dev.MemcpyBatchPath())
}

// A batch is checked whole before anything is submitted: the error names
// the copy at fault.
func ExampleCopyBatch_errors() {
	a := buffer.FromPointer(0x10000, 4096)
	b := buffer.FromPointer(0x20000, 4096)
	err := buffer.CopyBatch(nil, []buffer.Copy{
		{Dst: a, Src: b, Size: 4096},
		{Dst: b, Src: a, DstOffset: 4000, Size: 200},
	})
	var be *cuda.BatchCopyError
	if errors.As(err, &be) {
		fmt.Println("copy", be.Index, "is bad:", errors.Is(err, cuda.ErrInvalidArgument))
	}
	fmt.Println(err)
	// Output:
	// copy 1 is bad: true
	// CopyBatch: copy 1 of 2: cuda: invalid argument: destination range [4000, 4000+200) is past the end of the 4096-byte buffer
}
