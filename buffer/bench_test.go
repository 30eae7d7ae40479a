package buffer_test

import (
	"fmt"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// Benchmarks of 256 MiB copies and fills, reported in bytes per second
// (go test prints MB/s; divide by 1000 for GB/s). Each timed loop ends with
// a stream synchronization, after one untimed warm-up operation, as the C
// baseline (testdata/cgobench) does.

const benchSize = 256 << 20

func benchAlloc(b *testing.B, mr buffer.MemoryResource, size uint64, s *cuda.Stream) *buffer.Buffer {
	b.Helper()
	buf, err := buffer.Allocate(mr, size, s)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { buf.Close() })
	return buf
}

// benchLoop times op, which moves size bytes on s.
func benchLoop(b *testing.B, s *cuda.Stream, size int64, op func() error) {
	b.Helper()
	b.SetBytes(size)
	if err := op(); err != nil {
		b.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkCopyPinnedToDevice(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	src := benchAlloc(b, &pinnedResource{dev: d}, benchSize, s)
	dst := benchAlloc(b, &deviceResource{dev: d}, benchSize, s)
	benchLoop(b, s, benchSize, func() error { return src.CopyTo(dst, s) })
}

func BenchmarkCopyDeviceToPinned(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	src := benchAlloc(b, &deviceResource{dev: d}, benchSize, s)
	dst := benchAlloc(b, &pinnedResource{dev: d}, benchSize, s)
	benchLoop(b, s, benchSize, func() error { return src.CopyTo(dst, s) })
}

func BenchmarkCopyDeviceToDevice(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	src := benchAlloc(b, &deviceResource{dev: d}, benchSize, s)
	dst := benchAlloc(b, &deviceResource{dev: d}, benchSize, s)
	benchLoop(b, s, benchSize, func() error { return src.CopyTo(dst, s) })
}

// Peer copies, before and after peer access is enabled (the driver stages
// copies through the host without it; enabling it cannot be undone, so
// the sub-benchmarks run in this order).
func BenchmarkCopyPeer(b *testing.B) {
	ds := cudatest.Devices(b, 2)
	s := cudatest.Stream(b, ds[0])
	src := benchAlloc(b, &deviceResource{dev: ds[0]}, benchSize, s)
	dst := benchAlloc(b, &deviceResource{dev: ds[1]}, benchSize, s)
	b.Run("default", func(b *testing.B) {
		benchLoop(b, s, benchSize, func() error { return src.CopyTo(dst, s) })
	})
	b.Run("peer-access", func(b *testing.B) {
		if ok, err := ds[0].CanAccessPeer(ds[1]); err != nil || !ok {
			b.Skipf("no peer access between %v and %v (%v)", ds[0], ds[1], err)
		}
		if err := ds[0].EnablePeerAccess(ds[1]); err != nil {
			b.Fatal(err)
		}
		if err := ds[1].EnablePeerAccess(ds[0]); err != nil {
			b.Fatal(err)
		}
		benchLoop(b, s, benchSize, func() error { return src.CopyTo(dst, s) })
	})
}

func BenchmarkFill32(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	buf := benchAlloc(b, &deviceResource{dev: d}, benchSize, s)
	benchLoop(b, s, benchSize, func() error { return buf.Fill32(0x01020304, s) })
}

// stageConfig is one staging pool shape.
type stageConfig struct{ chunk, chunks, workers int }

func (c stageConfig) String() string {
	return fmt.Sprintf("%dMiBx%d-w%d", c.chunk>>20, c.chunks, c.workers)
}

// hostModes runs f once per way of copying a Go slice: "direct" (the
// driver's own staging), "staged" (the default pool), and the pool shapes
// of the sweep under "staged/".
func hostModes(b *testing.B, sweep bool, f func(b *testing.B)) {
	chunk, chunks, workers := buffer.StagingConfig()
	b.Cleanup(func() { buffer.ResetStaging(chunk, chunks, workers) })
	b.Run("direct", func(b *testing.B) {
		defer buffer.SetStaging(false)()
		f(b)
	})
	b.Run("staged", func(b *testing.B) {
		defer buffer.SetStaging(true)()
		f(b)
	})
	if !sweep {
		return
	}
	for _, c := range []stageConfig{
		{8 << 20, 4, 4}, {8 << 20, 4, 8}, {8 << 20, 4, 12}, {8 << 20, 4, 16},
		{4 << 20, 4, 8}, {16 << 20, 4, 8}, {2 << 20, 8, 8}, {16 << 20, 4, 16},
	} {
		b.Run("staged/"+c.String(), func(b *testing.B) {
			if err := buffer.ResetStaging(c.chunk, c.chunks, c.workers); err != nil {
				b.Fatal(err)
			}
			defer buffer.SetStaging(true)()
			f(b)
		})
	}
	if err := buffer.ResetStaging(chunk, chunks, workers); err != nil {
		b.Fatal(err)
	}
}

// touched returns n bytes of Go memory, written once so its pages exist.
func touched(n int) []byte {
	p := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		p[i] = byte(i)
	}
	return p
}

func BenchmarkCopyFromHost(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	dst := benchAlloc(b, &deviceResource{dev: d}, benchSize, s)
	src := touched(benchSize)
	hostModes(b, true, func(b *testing.B) {
		benchLoop(b, s, benchSize, func() error { return buffer.CopyFromHost(dst, src, s) })
	})
	b.Run("to-pinned-buffer", func(b *testing.B) {
		p := benchAlloc(b, &pinnedResource{dev: d}, benchSize, s)
		benchLoop(b, s, benchSize, func() error { return buffer.CopyFromHost(p, src, s) })
	})
}

func BenchmarkCopyToHost(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	src := benchAlloc(b, &deviceResource{dev: d}, benchSize, s)
	dst := touched(benchSize)
	hostModes(b, true, func(b *testing.B) {
		benchLoop(b, s, benchSize, func() error { return buffer.CopyToHost(dst, src, s) })
	})
	b.Run("from-pinned-buffer", func(b *testing.B) {
		p := benchAlloc(b, &pinnedResource{dev: d}, benchSize, s)
		benchLoop(b, s, benchSize, func() error { return buffer.CopyToHost(dst, p, s) })
	})
}

// Smaller host copies, near the staging threshold.
func BenchmarkCopyHostSizes(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	for _, size := range []int{1 << 20, 2 << 20, 4 << 20, 16 << 20} {
		dev := benchAlloc(b, &deviceResource{dev: d}, uint64(size), s)
		host := touched(size)
		b.Run(fmt.Sprintf("FromHost/%dMiB", size>>20), func(b *testing.B) {
			hostModes(b, false, func(b *testing.B) {
				benchLoop(b, s, int64(size), func() error { return buffer.CopyFromHost(dev, host, s) })
			})
		})
		b.Run(fmt.Sprintf("ToHost/%dMiB", size>>20), func(b *testing.B) {
			hostModes(b, false, func(b *testing.B) {
				benchLoop(b, s, int64(size), func() error { return buffer.CopyToHost(host, dev, s) })
			})
		})
	}
}
