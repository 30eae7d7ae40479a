package virtual

import (
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

func pinParallel(d *cuda.Device, size int) ([]byte, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	n := runtime.GOMAXPROCS(0)
	per := (size/n + 4095) &^ 4095
	var wg sync.WaitGroup
	for i := 0; i < size; i += per {
		wg.Add(1)
		go func(part []byte) {
			defer wg.Done()
			for j := 0; j < len(part); j += 4096 {
				part[j] = 0
			}
		}(mem[i:min(i+per, size)])
	}
	wg.Wait()
	if err := d.MemHostRegister(unsafe.Pointer(&mem[0]), uint64(size), 0); err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return mem, nil
}

func unpinParallel(d *cuda.Device, mem []byte) error {
	if err := d.MemHostUnregister(unsafe.Pointer(&mem[0])); err != nil {
		return err
	}
	return unix.Munmap(mem)
}

// TestGPUPinFigures compares ways of getting pinned host memory for a
// backup (CUDAMEM_SLEEP_FIGURES=1): cuMemHostAlloc, against anonymous
// memory touched by one goroutine per CPU and then registered
// (cuMemHostRegister).
func TestGPUPinFigures(t *testing.T) {
	if os.Getenv("CUDAMEM_SLEEP_FIGURES") != "1" {
		t.Skip("set CUDAMEM_SLEEP_FIGURES=1 to measure")
	}
	d := cudatest.Device(t)
	const size = 4 << 30
	for range 2 {
		t0 := time.Now()
		p, err := d.MemHostAlloc(size, 0)
		if err != nil {
			t.Fatal(err)
		}
		alloc := time.Since(t0)
		t0 = time.Now()
		if err := d.MemFreeHost(p); err != nil {
			t.Fatal(err)
		}
		free := time.Since(t0)
		t0 = time.Now()
		mem, err := pinParallel(d, size)
		if err != nil {
			t.Fatal(err)
		}
		par := time.Since(t0)
		t0 = time.Now()
		if err := unpinParallel(d, mem); err != nil {
			t.Fatal(err)
		}
		unpar := time.Since(t0)
		t.Logf("sleep-figures: pinning %d bytes: cuMemHostAlloc %v (%.1f GB/s, free %v); touched by %d goroutines + cuMemHostRegister %v (%.1f GB/s, unregister+unmap %v)",
			size, alloc, float64(size)/alloc.Seconds()/1e9, free, runtime.GOMAXPROCS(0), par, float64(size)/par.Seconds()/1e9, unpar)
	}
}
