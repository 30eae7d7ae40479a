package virtual_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/virtual"
)

// A growing array in virtual memory: append to it and it grows in place
// (1 GiB of address space is reserved up front; only what is used is
// backed by memory), keeping its data and never copying a byte.
// examples/grow-array is the whole program.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := virtual.New(dev, &virtual.Options{Reserve: 1 << 30})
	if err != nil {
		log.Fatal(err) // errors.Is(err, cuda.ErrNotSupported) without VMM
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	chunk := mr.Granularity() // usually 2 MiB
	arr, err := mr.Allocate(chunk, s)
	if err != nil {
		log.Fatal(err)
	}
	for i := range uint64(4) {
		if i > 0 { // grow by one chunk: arr is consumed
			grown, err := mr.Grow(arr, arr.Size()+chunk)
			if grown == nil {
				log.Fatal(err) // not grown: arr is as it was
			}
			arr = grown
			if err != nil && !errors.Is(err, buffer.ErrPartlyFreed) {
				log.Fatal(err)
			}
		}
		last, err := arr.Slice(i*chunk, chunk) // a view of the new chunk: never frees
		if err != nil {
			log.Fatal(err)
		}
		if err := last.Fill32(uint32(i)+1, s); err != nil {
			log.Fatal(err)
		}
	}
	defer arr.Close() // unmaps and releases every chunk
	head, err := arr.Slice(0, 4)
	if err != nil {
		log.Fatal(err)
	}
	first := make([]uint32, 1)
	if err := buffer.CopyToHost(first, head, s); err != nil {
		log.Fatal(err)
	}
	fmt.Println(arr.Size()/chunk, "chunks; the first still holds", first[0]) // 4 chunks; ... 1
}
