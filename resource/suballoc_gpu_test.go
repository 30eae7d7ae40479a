package resource_test

// GPU tests of SubAllocator over a DevicePool: what kernels see in
// sub-allocated memory, with ranges moving between streams.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// gpuSub returns a sub-allocator over an owned pool of dev. At the end of
// the test it is closed first, then the pool is checked to hold no live
// memory (everything went back), then the pool is closed.
func gpuSub(t *testing.T, dev *cuda.Device, opts *resource.SubAllocatorOptions) *resource.SubAllocator {
	t.Helper()
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{})
	checkLeaks(t, pool, dev)
	sa, err := resource.NewSubAllocator(pool, opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sa.Close()) })
	assert.Equal(t, dev.Ordinal(), sa.DeviceID())
	assert.True(t, sa.DeviceAccessible())
	assert.False(t, sa.HostAccessible())
	return sa
}

// Neighbouring allocations written by kernels on two streams, some freed
// and their ranges reused on the other stream: every live one still holds
// its own pattern.
func TestSubAllocatorGPUNeighbours(t *testing.T) {
	dev := cudatest.Device(t)
	sA, sB := cudatest.Stream(t, dev), cudatest.Stream(t, dev)
	k := cudatest.LoadKernels(t, dev)
	sa := gpuSub(t, dev, &resource.SubAllocatorOptions{GrowSize: 8 * mib})

	type live struct {
		b    *buffer.Buffer
		seed uint32
	}
	var bufs []live
	add := func(s *cuda.Stream, size uint64, seed uint32) {
		t.Helper()
		b, err := sa.Allocate(size, s)
		require.NoError(t, err)
		require.NoError(t, k.Write(s, b.Ptr(), b.Size(), seed))
		bufs = append(bufs, live{b, seed})
	}
	drop := func(every int, s *cuda.Stream) {
		t.Helper()
		kept := bufs[:0]
		for i, l := range bufs {
			if i%every == 0 {
				require.NoError(t, l.b.CloseOn(s))
				continue
			}
			kept = append(kept, l)
		}
		bufs = kept
	}

	for i := range 64 {
		add(sA, uint64(i%7+1)*4*kib+uint64(i)*100, uint32(i))
	}
	drop(3, sA) // freed on A while A's writes may still run
	for j := range 24 {
		add(sB, uint64(j%5+1)*3*kib, uint32(1000+j))
	}
	drop(4, sB)
	for j := range 24 {
		add(sA, uint64(j%3+1)*5*kib, uint32(2000+j))
	}
	st := sa.Stats()
	assert.Equal(t, 1, st.Blocks, "everything fits in the first block: %+v", st)
	assert.Equal(t, len(bufs), st.Allocations)

	require.NoError(t, sA.Sync())
	require.NoError(t, sB.Sync())
	for _, l := range bufs {
		k.RequireCheck(t, sA, l.b.Ptr(), l.b.Size(), l.seed)
	}
	for _, l := range bufs {
		closeBuf(t, l.b)
	}
	require.NoError(t, sa.Trim())
	assert.Zero(t, sa.Stats())
}

// A range freed on A, with kernels still queued on A that write it, is
// handed to an allocation on B: B's kernel must run after A's, so B's
// pattern is what stays.
func TestSubAllocatorGPUCrossStreamReuse(t *testing.T) {
	dev := cudatest.Device(t)
	sA, sB := cudatest.Stream(t, dev), cudatest.Stream(t, dev)
	k := cudatest.LoadKernels(t, dev)
	const size = 64 * mib
	sa := gpuSub(t, dev, &resource.SubAllocatorOptions{GrowSize: size})

	x, err := sa.Allocate(size, sA)
	require.NoError(t, err)
	p := x.Ptr()
	for range 20 { // keep A busy for a while
		require.NoError(t, k.Write(sA, p, size, 1))
	}
	closeBuf(t, x) // on A

	y, err := sa.Allocate(size, sB)
	require.NoError(t, err)
	require.Equal(t, p, y.Ptr(), "the only free range is reused")
	require.NoError(t, k.Write(sB, y.Ptr(), size, 2))
	k.RequireCheck(t, sB, y.Ptr(), size, 2)
	require.NoError(t, sA.Sync())
	k.RequireCheck(t, sA, y.Ptr(), size, 2) // nothing of A's ran after B's write
	closeBuf(t, y)
	assert.Equal(t, 1, sa.Stats().Blocks)
}

// Trim and Close give the pool its memory back; streams destroyed before
// are waited for through their device.
func TestSubAllocatorGPUTrimClose(t *testing.T) {
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	sa := gpuSub(t, dev, &resource.SubAllocatorOptions{GrowSize: 2 * mib, InitialSize: mib})
	s, err := dev.NewStream()
	require.NoError(t, err)
	b1, err := sa.Allocate(3*mib, s)
	require.NoError(t, err)
	b2, err := sa.Allocate(512*kib, nil) // from the initial block, on the default stream
	require.NoError(t, err)
	require.NoError(t, k.Write(s, b1.Ptr(), b1.Size(), 7))
	closeBuf(t, b1)
	require.NoError(t, s.Close()) // its free ranges outlive it
	require.NoError(t, sa.Trim())
	assert.Equal(t, resource.SubAllocatorStats{Reserved: mib, Used: 512 * kib, Free: 512 * kib, Blocks: 1, Allocations: 1, FreeRanges: 1}, sa.Stats())

	err = sa.Close()
	require.ErrorIs(t, err, cuda.ErrorIllegalState)
	_, err = sa.Allocate(1, nil)
	require.ErrorIs(t, err, cuda.ErrClosed)
	closeBuf(t, b2) // gives the last block back
	assert.Zero(t, sa.Stats())
}

// A stream that was closed gets no memory, from its cache, its free list
// or for size 0, as the pool refuses it; a free on it is refused with the
// buffer left open, and the ranges freed on it before serve another
// stream, whose kernel sees its own data there.
func TestSubAllocatorGPUClosedStream(t *testing.T) {
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	sa := gpuSub(t, dev, &resource.SubAllocatorOptions{GrowSize: 4 * mib})
	pool := sa.Upstream()
	s, err := dev.NewStream()
	require.NoError(t, err)
	s2, err := dev.NewStream()
	require.NoError(t, err)
	live, err := sa.Allocate(kib, s2) // first: s then takes the block's free range
	require.NoError(t, err)
	small, err := sa.Allocate(kib, s) // freed into s's cache
	require.NoError(t, err)
	closeBuf(t, small)
	large, err := sa.Allocate(2*mib, s) // freed onto s's list (past the cache's share)
	require.NoError(t, err)
	require.NoError(t, k.Write(s, large.Ptr(), large.Size(), 3))
	closeBuf(t, large)
	require.NoError(t, s.Close())
	require.NoError(t, s2.Close())

	for _, size := range []uint64{kib, 2 * mib, 0} {
		_, err := sa.Allocate(size, s)
		require.ErrorIs(t, err, cuda.ErrClosed, "%d bytes on a closed stream", size)
		_, err = buffer.Allocate(pool, size, s)
		require.ErrorIs(t, err, cuda.ErrClosed, "the pool's answer for %d bytes", size)
	}
	require.ErrorIs(t, live.Close(), cuda.ErrClosed)
	assert.False(t, live.IsClosed(), "the buffer stays open")
	require.NoError(t, live.CloseOn(dev.DefaultStream()))

	other := cudatest.Stream(t, dev)
	b, err := sa.Allocate(2*mib, other)
	require.NoError(t, err)
	require.NoError(t, k.Write(other, b.Ptr(), b.Size(), 4))
	k.RequireCheck(t, other, b.Ptr(), b.Size(), 4)
	closeBuf(t, b)
	assert.Equal(t, 1, sa.Stats().Blocks, "no growth")
}

// BenchmarkSubAllocatorPair: one allocate+free pair on one stream through
// a SubAllocator over the device's current pool, beside the same pair
// through the DevicePool itself.
func BenchmarkSubAllocatorPair(b *testing.B) {
	dev := cudatest.Device(b)
	s := cudatest.Stream(b, dev)
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		b.Fatal(err)
	}
	sa, err := resource.NewSubAllocator(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer sa.Close()
	for _, sz := range pairSizes[:2] {
		for _, mr := range []struct {
			name string
			mr   buffer.MemoryResource
		}{{"devicepool", pool}, {"suballoc", sa}} {
			b.Run(mr.name+"/"+sz.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					buf, err := buffer.Allocate(mr.mr, sz.n, s)
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
}

// BenchmarkSubAllocatorParallel: 256-byte pairs (Allocate + Buffer.Close)
// from g goroutines, each on its own stream ("own") or all on one
// ("shared"), through a SubAllocator over the device's current pool.
// The figure to read is pairs/s against the g=1 row: the goal is
// 8x or more at 16 goroutines on their own streams (the driver's pool
// gives 0.39x with 16 C threads: ../shared/reference/anchors.md).
// BenchmarkDevicePoolParallel is the same through the pool alone, the
// driver's scaling measured in the same run.
func BenchmarkSubAllocatorParallel(b *testing.B) {
	dev := cudatest.Device(b)
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		b.Fatal(err)
	}
	sa, err := resource.NewSubAllocator(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer sa.Close()
	parallelGPU(b, dev, sa)
}

// BenchmarkDevicePoolParallel: BenchmarkSubAllocatorParallel through the
// DevicePool alone (one driver allocation and free per pair).
func BenchmarkDevicePoolParallel(b *testing.B) {
	dev := cudatest.Device(b)
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		b.Fatal(err)
	}
	parallelGPU(b, dev, pool)
}

func parallelGPU(b *testing.B, dev *cuda.Device, mr buffer.MemoryResource) {
	for _, g := range resource.ParallelGoroutines {
		for _, mode := range []string{"own", "shared"} {
			b.Run(fmt.Sprintf("%d/%s", g, mode), func(b *testing.B) {
				shared := cudatest.Stream(b, dev)
				var streams []*cuda.Stream
				stream := func(int) *cuda.Stream {
					s := shared
					if mode == "own" {
						s = cudatest.Stream(b, dev)
					}
					streams = append(streams, s)
					return s
				}
				resource.ParallelPairs(b, g, stream, func(s *cuda.Stream) error {
					buf, err := buffer.Allocate(mr, 256, s)
					if err != nil {
						return err
					}
					return buf.Close()
				})
				for _, s := range streams {
					syncOrFail(b, s)
				}
			})
		}
	}
}
