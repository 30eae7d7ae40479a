//go:build linux

package dlpack_test

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/internal/testkit/dlpacktest"
)

// BenchmarkExportDelete is one hand-over: Export, then the deleter called
// from C on the same thread (the callback into Go, the goroutine hop).
func BenchmarkExportDelete(b *testing.B) {
	l := needC(b)
	buf := newHeap().alloc(b, 4096)
	defer buf.Close()
	b.ReportAllocs()
	for b.Loop() {
		v, err := dlpack.Export(buf)
		if err != nil {
			b.Fatal(err)
		}
		l.Delete(addr(v), true)
	}
}

// BenchmarkExportDeleteCThread is BenchmarkExportDelete with the deleter
// called from a new C thread each time (pthread_create included).
func BenchmarkExportDeleteCThread(b *testing.B) {
	l := needC(b)
	buf := newHeap().alloc(b, 4096)
	defer buf.Close()
	for b.Loop() {
		v, err := dlpack.Export(buf)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.DeleteOnThread(addr(v), true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkImportClose is one take-over of a C tensor: Import (reads
// through the kernel) and Close (the producer's deleter). The tensor is
// made in C each time, which the loop includes.
func BenchmarkImportClose(b *testing.B) {
	l := needC(b)
	data := l.Alloc(4096)
	defer l.Free(data)
	spec := dlpacktest.Spec{DevType: 1, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{4096}}
	b.ReportAllocs()
	for b.Loop() {
		in, err := dlpack.Import(l.Make(true, data, spec))
		if err != nil {
			b.Fatal(err)
		}
		if err := in.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkImportHost is Import and Close of a host tensor over resident
// memory of each size: the cost of the host checks (the maps file, one
// byte probed per page), which grows with the tensor.
func BenchmarkImportHost(b *testing.B) {
	needSupported(b)
	for _, size := range []int{4 << 10, 1 << 20, 64 << 20, 256 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
			if err != nil {
				b.Fatal(err)
			}
			defer syscall.Munmap(mem)
			for i := 0; i < size; i += 4096 {
				mem[i] = 1 // resident
			}
			h := newHostile()
			h.m.Tensor.Data = uintptr(unsafe.Pointer(&mem[0]))
			h.shape[0] = int64(size)
			b.SetBytes(int64(size))
			for b.Loop() {
				in, err := dlpack.Import(addr(&h.m))
				if err != nil {
					b.Fatal(err)
				}
				if err := in.Close(); err != nil {
					b.Fatal(err)
				}
			}
			runtime.KeepAlive(h)
		})
	}
}
