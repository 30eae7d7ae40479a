package virtual

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hostAlloc pins size bytes of host memory for a backup. cuMemHostAlloc
// faults in and zeroes every page on one thread, under 2 GB/s; anonymous
// memory whose pages one goroutine per CPU touches first, then registered
// with the driver (cuMemHostRegister), is pinned about five times as
// fast, and a first Sleep pays that.
func (d device) hostAlloc(size uint64) ([]byte, error) {
	if size == 0 || size > math.MaxInt {
		return nil, fmt.Errorf("pinning %d bytes: not a size this process can map", size)
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes of host memory: %w", size, err)
	}
	touch(mem)
	if err := d.MemHostRegister(unsafe.Pointer(&mem[0]), size, 0); err != nil {
		if uerr := unix.Munmap(mem); uerr != nil {
			err = fmt.Errorf("%w (and unmapping it again: %v)", err, uerr)
		}
		return nil, err
	}
	return mem, nil
}

func (d device) hostFree(mem []byte) error {
	if err := d.MemHostUnregister(unsafe.Pointer(&mem[0])); err != nil {
		return err
	}
	return unix.Munmap(mem)
}

// touch writes one byte of every page of mem, a share of the pages per
// CPU, so that the kernel faults them in (and zeroes them) in parallel.
func touch(mem []byte) {
	page := unix.Getpagesize()
	per := max((len(mem)/runtime.GOMAXPROCS(0)+page-1)/page*page, page)
	var wg sync.WaitGroup
	for i := 0; i < len(mem); i += per {
		wg.Add(1)
		go func(part []byte) {
			defer wg.Done()
			for j := 0; j < len(part); j += page {
				part[j] = 0
			}
		}(mem[i:min(i+per, len(mem))])
	}
	wg.Wait()
}
