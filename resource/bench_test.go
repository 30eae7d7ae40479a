package resource_test

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/loader"
	"github.com/cudamem/cudamem/resource"
)

// Each benchmark measures one allocate+free pair through the resource
// (Allocate, then Buffer.Close) and, in the same binary and run, the raw
// driver pair it wraps, so the two can be compared directly: the resource
// should stay within 1.3x of the raw pair.

var pairSizes = []struct {
	name string
	n    uint64
}{{"256B", 256}, {"1MiB", mib}, {"64MiB", 64 * mib}}

// BenchmarkDevicePoolPair: the device's current pool, release threshold at
// the maximum (NewDevicePool sets it), on one stream.
func BenchmarkDevicePoolPair(b *testing.B) {
	dev := cudatest.Device(b)
	s := cudatest.Stream(b, dev)
	mr, err := resource.CurrentDevicePool(dev)
	if err != nil {
		b.Fatal(err)
	}
	pool := mr.Pool()
	for _, sz := range pairSizes {
		b.Run("raw/"+sz.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := s.MemAllocFromPoolAsync(pool, sz.n)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.MemFreeAsync(p); err != nil {
					b.Fatal(err)
				}
			}
			syncOrFail(b, s)
		})
		b.Run("direct/"+sz.name, func(b *testing.B) {
			benchDirectPair(b, dev, pool, sz.n, s)
		})
		b.Run("ptr/"+sz.name, func(b *testing.B) {
			benchPtrPair(b, mr, sz.n, s)
		})
		b.Run("resource/"+sz.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf, err := mr.Allocate(sz.n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := buf.Close(); err != nil {
					b.Fatal(err)
				}
			}
			syncOrFail(b, s)
		})
	}
}

// BenchmarkPinnedPoolPair: 1 MiB of pinned host memory from a host pool.
func BenchmarkPinnedPoolPair(b *testing.B) {
	dev := cudatest.Device(b)
	s := cudatest.Stream(b, dev)
	mr, err := resource.NewPinnedPool(nil)
	cudatest.SkipIfNotSupported(b, err)
	if err != nil {
		b.Fatal(err)
	}
	defer mr.Close()
	pool := mr.Pool()
	b.Run("raw/1MiB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, err := s.MemAllocFromPoolAsync(pool, mib)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.MemFreeAsync(p); err != nil {
				b.Fatal(err)
			}
		}
		syncOrFail(b, s)
	})
	b.Run("direct/1MiB", func(b *testing.B) {
		benchDirectPair(b, dev, pool, mib, s)
	})
	b.Run("ptr/1MiB", func(b *testing.B) {
		benchPtrPair(b, mr, mib, s)
	})
	b.Run("resource/1MiB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, err := mr.Allocate(mib, s)
			if err != nil {
				b.Fatal(err)
			}
			if err := buf.Close(); err != nil {
				b.Fatal(err)
			}
		}
		syncOrFail(b, s)
	})
}

// BenchmarkLegacyPinnedPair: 1 MiB through cuMemHostAlloc/cuMemFreeHost.
func BenchmarkLegacyPinnedPair(b *testing.B) {
	dev := cudatest.Device(b)
	s := cudatest.Stream(b, dev)
	mr, err := resource.NewLegacyPinned()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("raw/1MiB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, err := dev.MemHostAlloc(mib, cuda.MemHostAllocPortable|cuda.MemHostAllocDeviceMap)
			if err != nil {
				b.Fatal(err)
			}
			if err := dev.MemFreeHost(p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("resource/1MiB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, err := mr.Allocate(mib, s)
			if err != nil {
				b.Fatal(err)
			}
			if err := buf.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchDirectPair makes the raw pair's two driver calls the way the C
// baseline makes them: on one locked OS thread whose context was made
// current once, through symbols looked up in the driver library, with no
// cudamem code between the calls. Beside "raw" (the cuda package's
// methods, which make the context current on each call and hold the
// stream open around it) it shows what the cuda layer adds, in-process.
func benchDirectPair(b *testing.B, dev *cuda.Device, pool cuda.MemPool, n uint64, s *cuda.Stream) {
	lib, err := loader.OpenLibrary("libcuda.so.1")
	if err != nil {
		b.Skipf("driver library: %v", err)
	}
	var procs [3]loader.Proc
	for i, name := range []string{"cuCtxSetCurrent", "cuMemAllocFromPoolAsync", "cuMemFreeAsync"} {
		if procs[i], err = lib.Lookup(name); err != nil {
			b.Skipf("%s: %v", name, err)
		}
	}
	ctx, err := dev.Context()
	if err != nil {
		b.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := procs[0].Call(ctx); r != 0 {
		b.Fatalf("cuCtxSetCurrent: CUresult %d", r)
	}
	h := s.Handle()
	b.ReportAllocs()
	var p uintptr
	for b.Loop() {
		if r := procs[1].Call(uintptr(unsafe.Pointer(&p)), uintptr(n), pool.Handle(), h); r != 0 {
			b.Fatalf("cuMemAllocFromPoolAsync: CUresult %d", r)
		}
		if r := procs[2].Call(p, h); r != 0 {
			b.Fatalf("cuMemFreeAsync: CUresult %d", r)
		}
	}
	syncOrFail(b, s)
}

// benchPtrPair measures the resource's own layer without a Buffer
// (AllocatePtr, Deallocate): between a raw driver pair and a resource
// pair, it splits what the resource adds from what its Buffer adds.
func benchPtrPair(b *testing.B, mr buffer.MemoryResource, n uint64, s *cuda.Stream) {
	b.ReportAllocs()
	for b.Loop() {
		p, ps, err := mr.AllocatePtr(n, s)
		if err != nil {
			b.Fatal(err)
		}
		if err := mr.Deallocate(p, n, ps); err != nil {
			b.Fatal(err)
		}
	}
	syncOrFail(b, s)
}

func syncOrFail(b *testing.B, s *cuda.Stream) {
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
}

// nopResource is a MemoryResource whose Deallocate does nothing.
type nopResource struct{}

func (nopResource) AllocatePtr(uint64, *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0, nil, nil
}
func (nopResource) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (nopResource) DeviceAccessible() bool                                { return true }
func (nopResource) HostAccessible() bool                                  { return false }
func (nopResource) DeviceID() int                                         { return 0 }

// BenchmarkOwnedBufferPair measures what wrapping memory in a Buffer and
// closing it costs (buffer.Owned + Buffer.Close over a resource that does
// nothing): the part of a resource pair that is not the driver's. It needs
// no GPU.
func BenchmarkOwnedBufferPair(b *testing.B) {
	b.ReportAllocs()
	var mr nopResource
	for b.Loop() {
		if err := buffer.Owned(0x1000, 256, mr, nil).Close(); err != nil {
			b.Fatal(err)
		}
	}
}
