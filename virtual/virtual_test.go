package virtual_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/virtual"
)

func newResource(t testing.TB, d *cuda.Device, o *virtual.Options) *virtual.Resource {
	t.Helper()
	r, err := virtual.New(d, o)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.Empty(t, r.Live(), "every allocation freed") })
	return r
}

func TestVmmAllocatorBasicAllocation(t *testing.T) {
	d := cudatest.Device(t)
	r := newResource(t, d, nil)
	b, err := r.Allocate(4096, nil)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, b.Size(), uint64(4096))
	assert.Equal(t, d.Ordinal(), r.DeviceID())
	assert.Equal(t, buffer.MemoryResource(r), b.Resource())
	info, err := r.Info(b)
	require.NoError(t, err)
	assert.Equal(t, r.Granularity(), info.Mapped)
	require.NoError(t, b.Close())
	for i := 0; i < 5; i++ {
		b, err := r.Allocate(uint64(1024*(i+1)), nil)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, b.Size(), uint64(1024*(i+1)))
		require.NoError(t, b.Close())
	}
	z, err := r.Allocate(0, nil)
	require.NoError(t, err)
	assert.Zero(t, z.Size())
	require.NoError(t, z.Close())
}

func TestVmmAllocatorPolicyConfiguration(t *testing.T) {
	d := cudatest.Device(t)
	r := newResource(t, d, &virtual.Options{Granularity: virtual.Minimum, GPUDirectRDMA: true, HandleType: virtual.HandlePosixFD})
	assert.True(t, r.Options().GPUDirectRDMA)
	b, err := r.Allocate(8192, nil)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, b.Size(), uint64(8192))
	b, err = r.Grow(b, 16384)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, b.Size(), uint64(16384))
	require.NoError(t, b.Close())
}

func TestVmmAllocatorRdmaUnsupportedException(t *testing.T) {
	d := cudatest.Device(t)
	f, err := d.Features()
	require.NoError(t, err)
	if f.GPUDirectRDMAWithVMM {
		t.Skip("device supports GPUDirect RDMA with VMM")
	}
	_, err = virtual.New(d, &virtual.Options{GPUDirectRDMA: true})
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "GPUDirect RDMA is not supported")
}

func TestVmmAllocatorGrowAllocation(t *testing.T) {
	d := cudatest.Device(t)
	r := newResource(t, d, nil)
	b, err := r.Allocate(2<<20, nil)
	require.NoError(t, err)
	orig := b.Size()
	g, err := r.Grow(b, 4<<20)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, g.Size(), uint64(4<<20))
	assert.Greater(t, g.Size(), orig)
	same, err := r.Grow(g, g.Size())
	require.NoError(t, err)
	assert.Same(t, g, same, "growing to the same size changes nothing")
	same, err = r.Grow(g, 2<<20)
	require.NoError(t, err)
	assert.Same(t, g, same, "growing to a smaller size changes nothing")
	require.NoError(t, g.Close())
}

// TestGrowKeepsDataInPlace grows within the adjacent address space: the
// pointer stays, the data written before is intact on the device, and the
// new memory is usable.
func TestGrowKeepsDataInPlace(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r := newResource(t, d, &virtual.Options{Reserve: 64 << 20})
	gran := r.Granularity()
	b, err := r.Allocate(gran, s)
	require.NoError(t, err)
	ptr := b.Ptr()
	require.NoError(t, k.Write(s, ptr, gran, 1))
	for i := uint64(2); i <= 4; i++ {
		nb, err := r.Grow(b, i*gran)
		require.NoError(t, err)
		assert.Equal(t, ptr, nb.Ptr(), "grow within the reservation keeps the pointer")
		assert.True(t, b.IsClosed(), "the old buffer is handed over")
		b = nb
	}
	k.RequireCheck(t, s, ptr, gran, 1)
	require.NoError(t, k.Write(s, ptr, 4*gran, 2))
	k.RequireCheck(t, s, ptr, 4*gran, 2)
	info, err := r.Info(b)
	require.NoError(t, err)
	assert.Equal(t, 4, info.Chunks)
	assert.Equal(t, uint64(64<<20), info.Reserved)
	require.NoError(t, b.Close())
}

// TestGrowRemapsWhenBlocked takes the address space after an allocation, so
// Grow must move it: the data still follows, without a copy.
func TestGrowRemapsWhenBlocked(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r := newResource(t, d, nil)
	gran := r.Granularity()
	b, err := r.Allocate(2*gran, s)
	require.NoError(t, err)
	old := b.Ptr()
	// No sync: Grow itself must let the kernel finish before it unmaps the
	// old addresses.
	require.NoError(t, k.Write(s, old, 2*gran, 3))
	hint := old + cuda.DevicePtr(2*gran)
	blocker, err := d.MemAddressReserve(gran, gran, hint)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.MemAddressFree(blocker, gran)) })
	if blocker != hint {
		t.Logf("driver placed the blocker at %#x, not %#x: grow may stay in place", uint64(blocker), uint64(hint))
	}
	nb, err := r.Grow(b, 5*gran)
	require.NoError(t, err)
	if blocker == hint {
		assert.NotEqual(t, old, nb.Ptr(), "a blocked grow moves the allocation")
	}
	assert.True(t, b.IsClosed())
	assert.ErrorIs(t, b.Fill32(0, s), cuda.ErrClosed, "the old buffer is handed over")
	k.RequireCheck(t, s, nb.Ptr(), 2*gran, 3)
	require.NoError(t, k.Write(s, nb.Ptr(), 5*gran, 4))
	k.RequireCheck(t, s, nb.Ptr(), 5*gran, 4)
	info, err := r.Info(nb)
	require.NoError(t, err)
	assert.Equal(t, 2, info.Chunks)
	require.NoError(t, nb.Close())
}

func TestShrinkReleasesChunksAndRegrows(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r := newResource(t, d, &virtual.Options{Reserve: 1 << 30})
	const chunk = 64 << 20
	b, err := r.Allocate(chunk, s)
	require.NoError(t, err)
	for i := 2; i <= 4; i++ {
		b, err = r.Grow(b, uint64(i)*chunk)
		require.NoError(t, err)
	}
	require.NoError(t, k.Write(s, b.Ptr(), chunk, 5))
	require.NoError(t, s.Sync())
	free0, _, err := d.MemInfo()
	require.NoError(t, err)
	b, err = r.Shrink(b, chunk)
	require.NoError(t, err)
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free1, free0+3*chunk-(2<<20), "three chunks went back to the device")
	info, err := r.Info(b)
	require.NoError(t, err)
	assert.Equal(t, 1, info.Chunks)
	k.RequireCheck(t, s, b.Ptr(), chunk, 5)
	ptr := b.Ptr()
	b, err = r.Grow(b, 2*chunk)
	require.NoError(t, err)
	assert.Equal(t, ptr, b.Ptr())
	require.NoError(t, b.Close())
}

// TestEveryHandleReleased grows and shrinks through every path and checks
// the device's free memory returns to where it was.
func TestEveryHandleReleased(t *testing.T) {
	d := cudatest.Device(t)
	r := newResource(t, d, nil)
	require.NoError(t, d.Sync())
	before, _, err := d.MemInfo()
	require.NoError(t, err)
	const step = 256 << 20
	b, err := r.Allocate(step, nil)
	require.NoError(t, err)
	for i := 2; i <= 4; i++ {
		b, err = r.Grow(b, uint64(i)*step)
		require.NoError(t, err)
	}
	b, err = r.Shrink(b, step)
	require.NoError(t, err)
	b, err = r.Grow(b, 2*step)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	after, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.InDelta(t, float64(before), float64(after), float64(8<<20), "device memory back to where it was")
}

func TestPeerAccessOnVMM(t *testing.T) {
	ds := cudatest.Devices(t, 2)
	ok, err := ds[1].CanAccessPeer(ds[0])
	require.NoError(t, err)
	if !ok {
		t.Skip("GPU 1 cannot access GPU 0")
	}
	r := newResource(t, ds[0], &virtual.Options{Peers: []*cuda.Device{ds[1]}})
	s0, s1 := cudatest.Stream(t, ds[0]), cudatest.Stream(t, ds[1])
	k0, k1 := cudatest.LoadKernels(t, ds[0]), cudatest.LoadKernels(t, ds[1])
	gran := r.Granularity()
	b, err := r.Allocate(gran, s0)
	require.NoError(t, err)
	b, err = r.Grow(b, 2*gran)
	require.NoError(t, err)
	// A kernel on GPU 1 writes GPU 0's memory, GPU 0 checks it.
	require.NoError(t, k1.Write(s1, b.Ptr(), 2*gran, 6))
	require.NoError(t, s1.Sync())
	k0.RequireCheck(t, s0, b.Ptr(), 2*gran, 6)
	a, err := r.Access(b, ds[1])
	require.NoError(t, err)
	assert.Equal(t, virtual.ReadWrite, a)
	require.NoError(t, r.SetPeerAccess(b, virtual.NoAccess, ds[1]))
	a, err = r.Access(b, ds[1])
	require.NoError(t, err)
	assert.Equal(t, virtual.NoAccess, a, "revoked (checked through the driver, never by faulting)")
	err = r.SetPeerAccess(b, virtual.ReadWrite, ds[0])
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.NoError(t, b.Close())
}

func TestExportImportAliases(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r := newResource(t, d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	gran := r.Granularity()
	b, err := r.Allocate(gran, s)
	require.NoError(t, err)
	b, err = r.Grow(b, 3*gran)
	require.NoError(t, err)
	chunks, err := r.Export(b)
	require.NoError(t, err)
	defer func() { require.NoError(t, virtual.CloseChunkFDs(chunks)) }()
	require.Len(t, chunks, 2)
	imp, err := r.Import(chunks, 3*gran)
	require.NoError(t, err)
	assert.NotEqual(t, b.Ptr(), imp.Ptr())
	require.NoError(t, k.Write(s, b.Ptr(), 3*gran, 7))
	k.RequireCheck(t, s, imp.Ptr(), 3*gran, 7)
	require.NoError(t, imp.Close())
	k.RequireCheck(t, s, b.Ptr(), 3*gran, 7) // the exporter's memory lives on
	require.NoError(t, b.Close())
	_, err = r.Import(nil, 1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = r.Import([]virtual.Chunk{{FD: -1, Size: gran}}, gran)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestWrongBuffers(t *testing.T) {
	d := cudatest.Device(t)
	r := newResource(t, d, nil)
	other := newResource(t, d, nil)
	b, err := other.Allocate(1<<20, nil)
	require.NoError(t, err)
	_, err = r.Grow(b, 4<<20)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a buffer of another resource")
	require.NoError(t, b.Close())
	_, err = other.Grow(b, 4<<20)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = r.Grow(nil, 1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	err = r.Deallocate(0xdead0000, 4, nil)
	assert.True(t, errors.Is(err, cuda.ErrInvalidArgument))
}

func TestHostLocatedMemory(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r := newResource(t, d, &virtual.Options{Location: virtual.OnHost, HandleType: virtual.HandleNone})
	assert.Equal(t, -1, r.DeviceID())
	b, err := r.Allocate(r.Granularity(), s)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	require.NoError(t, k.Write(s, b.Ptr(), b.Size(), 8))
	k.RequireCheck(t, s, b.Ptr(), b.Size(), 8)
	require.NoError(t, b.Close())
}

func BenchmarkAllocateFree(b *testing.B) {
	d := cudatest.Device(b)
	r, err := virtual.New(d, nil)
	require.NoError(b, err)
	for _, size := range []uint64{2 << 20, 1 << 30} {
		b.Run(sizeName(size), func(b *testing.B) {
			for b.Loop() {
				buf, err := r.Allocate(size, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := buf.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGrowStep grows one allocation by 2 MiB per iteration (in a
// reservation of 8 GiB): the per-step cost stays flat as it grows.
func BenchmarkGrowStep(b *testing.B) {
	d := cudatest.Device(b)
	r, err := virtual.New(d, &virtual.Options{Reserve: 8 << 30})
	require.NoError(b, err)
	buf, err := r.Allocate(2<<20, nil)
	require.NoError(b, err)
	size := uint64(2 << 20)
	for b.Loop() {
		if size+2<<20 > 8<<30 {
			b.StopTimer()
			buf, err = r.Shrink(buf, 2<<20)
			require.NoError(b, err)
			size = 2 << 20
			b.StartTimer()
		}
		size += 2 << 20
		if buf, err = r.Grow(buf, size); err != nil {
			b.Fatal(err)
		}
	}
	require.NoError(b, buf.Close())
}

func sizeName(n uint64) string {
	if n >= 1<<30 {
		return "1GiB"
	}
	return "2MiB"
}

// TestShrinkThenWriteAtNewEnd shrinks to a size that ends inside a chunk,
// then writes right up to the new end: the chunk holding it must still be
// mapped (before the fix a failed shrink could leave the end unmapped; a
// write there is an illegal address). Then it grows back in place, and the
// data kept across both is checked by the device.
func TestShrinkThenWriteAtNewEnd(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r := newResource(t, d, &virtual.Options{Reserve: 1 << 30})
	gran := r.Granularity()
	b, err := r.Allocate(gran, s)
	require.NoError(t, err)
	for i := uint64(2); i <= 4; i++ {
		b, err = r.Grow(b, i*gran)
		require.NoError(t, err)
	}
	ptr := b.Ptr()
	require.NoError(t, k.Write(s, ptr, 4*gran, 11))
	newSize := 2*gran + gran/2
	b, err = r.Shrink(b, newSize)
	require.NoError(t, err)
	assert.Equal(t, ptr, b.Ptr(), "shrinking never moves")
	assert.Equal(t, newSize, b.Size())
	info, err := r.Info(b)
	require.NoError(t, err)
	assert.Equal(t, virtual.Info{Size: newSize, Mapped: 3 * gran, Reserved: 1 << 30, Chunks: 3}, info)
	k.RequireCheck(t, s, ptr, newSize, 11) // the kept data, up to the last byte
	const tail = 64 << 10
	require.NoError(t, k.Write(s, ptr+cuda.DevicePtr(newSize-tail), tail, 12))
	k.RequireCheck(t, s, ptr+cuda.DevicePtr(newSize-tail), tail, 12)
	require.NoError(t, s.Sync())
	b, err = r.Grow(b, 4*gran)
	require.NoError(t, err)
	assert.Equal(t, ptr, b.Ptr(), "growing back within the reservation stays in place")
	k.RequireCheck(t, s, ptr, 2*gran, 11)
	require.NoError(t, k.Write(s, ptr, 4*gran, 13))
	k.RequireCheck(t, s, ptr, 4*gran, 13)
	require.NoError(t, r.Reclaim(), "nothing pending on a healthy driver")
	require.NoError(t, b.Close())
}

// TestGrowShrinkCyclesKeepData grows and shrinks one allocation many
// times, through every path (in place, adjacent, moved past a blocker),
// checking on the device after each step that the data written at the
// start survives, and that device memory returns to where it was.
func TestGrowShrinkCyclesKeepData(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	require.NoError(t, d.Sync())
	free0, _, err := d.MemInfo()
	require.NoError(t, err)
	for _, o := range []*virtual.Options{nil, {Reserve: 16 << 20}} {
		r := newResource(t, d, o)
		gran := r.Granularity()
		b, err := r.Allocate(gran, s)
		require.NoError(t, err)
		require.NoError(t, k.Write(s, b.Ptr(), gran, 21))
		var blockers []cuda.DevicePtr
		for i := 0; i < 12; i++ {
			if i%3 == 2 {
				// Take the range after the allocation: the next grow must
				// move it (if the driver grants the blocker there).
				info, err := r.Info(b)
				require.NoError(t, err)
				p, err := d.MemAddressReserve(gran, gran, b.Ptr()+cuda.DevicePtr(info.Reserved))
				require.NoError(t, err)
				blockers = append(blockers, p)
			}
			b, err = r.Grow(b, b.Size()+uint64(i%4+1)*gran)
			require.NoError(t, err)
			k.RequireCheck(t, s, b.Ptr(), gran, 21)
			require.NoError(t, k.Write(s, b.Ptr()+cuda.DevicePtr(gran), b.Size()-gran, uint32(30+i)))
			k.RequireCheck(t, s, b.Ptr()+cuda.DevicePtr(gran), b.Size()-gran, uint32(30+i))
			if i%2 == 1 {
				b, err = r.Shrink(b, gran+uint64(i)*gran/4)
				require.NoError(t, err)
				k.RequireCheck(t, s, b.Ptr(), gran, 21)
			}
		}
		require.NoError(t, r.Reclaim())
		require.NoError(t, b.Close())
		for _, p := range blockers {
			require.NoError(t, d.MemAddressFree(p, gran))
		}
	}
	require.NoError(t, d.Sync())
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.InDelta(t, float64(free0), float64(free1), float64(8<<20), "device memory back to where it was")
}
