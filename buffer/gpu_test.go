package buffer_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// GPU tests: they skip without a driver or device (and fail instead with
// CUDAMEM_REQUIRE_GPU=1). Data is checked both ways: read back to the host,
// and checked on the device by the pattern kernels.

// gpu returns device 0, a stream and the test kernels.
func gpu(t *testing.T) (*cuda.Device, *cuda.Stream, *cudatest.Kernels) {
	t.Helper()
	d := cudatest.Device(t)
	return d, cudatest.Stream(t, d), cudatest.LoadKernels(t, d)
}

// requireHost reads b back to the host and compares it with want.
func requireHost(t *testing.T, b *buffer.Buffer, s *cuda.Stream, want []byte) {
	t.Helper()
	got := make([]byte, b.Size())
	require.NoError(t, buffer.CopyToHost(got, b, s))
	requireBytes(t, want, got)
}

func requireBytes(t *testing.T, want, got []byte) {
	t.Helper()
	require.Equal(t, len(want), len(got), "length")
	if !bytes.Equal(want, got) {
		i := 0
		for want[i] == got[i] {
			i++
		}
		t.Fatalf("bytes differ first at %d of %d: got %#x, want %#x", i, len(want), got[i], want[i])
	}
}

// test_buffer_initialization
func TestBufferInitialization(t *testing.T) {
	t.Run("host", func(t *testing.T) {
		mr := newHeap()
		b, err := buffer.Allocate(mr, 1024, nil)
		require.NoError(t, err)
		assert.NotZero(t, b.Ptr())
		assert.Equal(t, uint64(1024), b.Size())
		assert.Same(t, mr, b.Resource())
		assert.Equal(t, mr.DeviceAccessible(), b.DeviceAccessible())
		assert.Equal(t, mr.HostAccessible(), b.HostAccessible())
		assert.Equal(t, -1, b.DeviceID())
		p, err := b.Bytes()
		require.NoError(t, err)
		copy(p, cudatest.Pattern(1024, 5))
		q, err := b.Bytes()
		require.NoError(t, err)
		assert.Equal(t, cudatest.Pattern(1024, 5), q)
		require.NoError(t, b.Close())
	})
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			d, s, k := gpu(t)
			mr := newResource(t, kind, d)
			b, err := buffer.Allocate(mr, 1024, s)
			require.NoError(t, err)
			assert.NotZero(t, b.Ptr())
			assert.Equal(t, uint64(1024), b.Size())
			assert.Same(t, mr, b.Resource())
			assert.Same(t, s, b.Stream())
			assert.Equal(t, mr.DeviceAccessible(), b.DeviceAccessible())
			assert.Equal(t, mr.HostAccessible(), b.HostAccessible())
			assert.Equal(t, mr.DeviceID(), b.DeviceID())
			require.NoError(t, k.Write(s, b.Ptr(), 1024, 7))
			requireHost(t, b, s, cudatest.Pattern(1024, 7))
			require.NoError(t, b.Close())
		})
	}
}

// test_buffer_copy_to
func TestBufferCopyTo(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			d, s, k := gpu(t)
			mr := newResource(t, kind, d)
			src, dst := alloc(t, mr, 1024, s), alloc(t, mr, 1024, s)
			require.NoError(t, k.Write(s, src.Ptr(), 1024, 11))
			require.NoError(t, src.CopyTo(dst, s))
			k.RequireCheck(t, s, dst.Ptr(), 1024, 11)
			requireHost(t, dst, s, cudatest.Pattern(1024, 11))
			if kind == "pinned" {
				require.NoError(t, d.Sync())
				p, err := dst.Bytes()
				require.NoError(t, err)
				assert.Equal(t, cudatest.Pattern(10, 11), p[:10])
			}
		})
	}
}

// test_buffer_copy_from
func TestBufferCopyFrom(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			d, s, k := gpu(t)
			mr := newResource(t, kind, d)
			src, dst := alloc(t, mr, 1024, s), alloc(t, mr, 1024, s)
			require.NoError(t, k.Write(s, src.Ptr(), 1024, 12))
			require.NoError(t, dst.CopyFrom(src, s))
			k.RequireCheck(t, s, dst.Ptr(), 1024, 12)
			requireHost(t, dst, s, cudatest.Pattern(1024, 12))
			if kind == "pinned" {
				require.NoError(t, d.Sync())
				p, err := dst.Bytes()
				require.NoError(t, err)
				assert.Equal(t, cudatest.Pattern(10, 12), p[:10])
			}
		})
	}
}

// Copies between every pair of kinds, on a nil stream and on a stream.
func TestBufferCopyBetweenKinds(t *testing.T) {
	d, s, k := gpu(t)
	const n = 64<<10 + 3
	for i, from := range kinds {
		for j, to := range kinds {
			t.Run(from+"->"+to, func(t *testing.T) {
				src := alloc(t, newResource(t, from, d), n, nil)
				dst := alloc(t, newResource(t, to, d), n, nil)
				seed := uint32(20 + 3*i + j)
				require.NoError(t, k.Write(s, src.Ptr(), n, seed))
				require.NoError(t, s.Sync())
				require.NoError(t, src.CopyTo(dst, nil), "nil stream: the legacy default stream")
				require.NoError(t, d.Sync())
				k.RequireCheck(t, s, dst.Ptr(), n, seed)
				requireHost(t, dst, s, cudatest.Pattern(n, seed))
			})
		}
	}
}

// test_buffer_close
func TestBufferClose(t *testing.T) {
	check := func(t *testing.T, b *buffer.Buffer) {
		require.NoError(t, b.Close())
		assert.Zero(t, b.Ptr())
		assert.Nil(t, b.Resource())
		assert.True(t, b.IsClosed())
		require.NoError(t, b.Close())
	}
	t.Run("host", func(t *testing.T) {
		mr := newHeap()
		b, err := buffer.Allocate(mr, 1024, nil)
		require.NoError(t, err)
		check(t, b)
		assert.Equal(t, 1, mr.free)
	})
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			d, s, _ := gpu(t)
			mr := newResource(t, kind, d)
			b, err := buffer.Allocate(mr, 1024, s)
			require.NoError(t, err)
			check(t, b)
			assert.ErrorIs(t, b.Fill8(0, s), cuda.ErrClosed)
		})
	}
}

func TestBufferCloseOn(t *testing.T) {
	d, s, k := gpu(t)
	other := cudatest.Stream(t, d)
	mr := &deviceResource{dev: d}
	b, err := buffer.Allocate(mr, 1<<20, s)
	require.NoError(t, err)
	require.NoError(t, k.Write(other, b.Ptr(), 1<<20, 3))
	require.NoError(t, b.CloseOn(other), "freed after the kernel on the other stream")
	require.NoError(t, b.Close())
	require.NoError(t, b.CloseOn(s))
	require.Len(t, mr.frees, 1)
	assert.Same(t, other, mr.frees[0])

	c, err := buffer.Allocate(mr, 64, s)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.Same(t, s, mr.frees[1], "Close frees on the allocation stream")
}

func TestBufferClone(t *testing.T) {
	d, s, k := gpu(t)
	dev, pinned := &deviceResource{dev: d}, &pinnedResource{dev: d}
	src := alloc(t, dev, 4096, s)
	require.NoError(t, k.Write(s, src.Ptr(), 4096, 41))

	c, err := src.Clone(nil, s)
	require.NoError(t, err)
	defer c.Close()
	assert.Same(t, dev, c.Resource(), "nil: the buffer's own resource")
	assert.Same(t, s, c.Stream())
	assert.NotEqual(t, src.Ptr(), c.Ptr())
	k.RequireCheck(t, s, c.Ptr(), 4096, 41)

	h, err := src.Clone(pinned, nil)
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, s.Sync())
	p, err := h.Bytes()
	require.NoError(t, err)
	requireBytes(t, cudatest.Pattern(4096, 41), p)
}

func TestBufferFill(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			d, s, _ := gpu(t)
			b := alloc(t, newResource(t, kind, d), 4096, s)
			want := func(word []byte) []byte { return bytes.Repeat(word, 4096/len(word)) }

			require.NoError(t, b.Fill8(0xab, s))
			requireHost(t, b, s, want([]byte{0xab}))
			require.NoError(t, b.Fill16(0xbeef, nil))
			requireHost(t, b, s, want([]byte{0xef, 0xbe}))
			require.NoError(t, b.Fill32(0xdeadbeef, s))
			requireHost(t, b, s, want([]byte{0xef, 0xbe, 0xad, 0xde}))

			// A view fills its range only.
			v, err := b.Slice(8, 16)
			require.NoError(t, err)
			require.NoError(t, v.Fill32(0x01020304, s))
			w := want([]byte{0xef, 0xbe, 0xad, 0xde})
			copy(w[8:24], bytes.Repeat([]byte{4, 3, 2, 1}, 4))
			requireHost(t, b, s, w)

			odd, err := b.Slice(0, 4094)
			require.NoError(t, err)
			err = odd.Fill32(1, s)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "buffer size 4094 is not a multiple of the fill width 4")
		})
	}
}

// Host copies of typed slices; the device sees the bytes in Go's layout.
func TestCopyHostTypes(t *testing.T) {
	d, s, k := gpu(t)
	mr := &deviceResource{dev: d}

	t.Run("uint16", func(t *testing.T) {
		const n = 1000
		pat := cudatest.Pattern(2*n, 17)
		src := make([]uint16, n)
		for i := range src {
			src[i] = binary.LittleEndian.Uint16(pat[2*i:])
		}
		b := alloc(t, mr, 2*n, s)
		require.NoError(t, buffer.CopyFromHost(b, src, s))
		k.RequireCheck(t, s, b.Ptr(), 2*n, 17)
		got := make([]uint16, n)
		require.NoError(t, buffer.CopyToHost(got, b, s))
		assert.Equal(t, src, got)
	})
	t.Run("float32", func(t *testing.T) {
		const n = 4096
		b := alloc(t, mr, 4*n, s)
		require.NoError(t, b.Fill32(math.Float32bits(1.5), s))
		got := make([]float32, n)
		require.NoError(t, buffer.CopyToHost(got, b, s))
		for i, v := range got {
			require.Equal(t, float32(1.5), v, "element %d", i)
		}
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i) / 3
		}
		require.NoError(t, buffer.CopyFromHost(b, src, s))
		require.NoError(t, buffer.CopyToHost(got, b, s))
		assert.Equal(t, src, got)
	})
	t.Run("struct", func(t *testing.T) {
		type point struct {
			X, Y float32
			ID   uint16
			Tag  [2]int8
			Ok   bool
			_    [3]byte
		}
		src := make([]point, 333)
		for i := range src {
			src[i] = point{X: float32(i), Y: -float32(i), ID: uint16(i * 7), Tag: [2]int8{int8(i), -int8(i)}, Ok: i%2 == 0}
		}
		b := alloc(t, mr, 333*16, s)
		require.NoError(t, buffer.CopyFromHost(b, src, s))
		got := make([]point, 333)
		require.NoError(t, buffer.CopyToHost(got, b, s))
		assert.Equal(t, src, got)
	})
	t.Run("pointers", func(t *testing.T) {
		b := alloc(t, mr, 8, s)
		err := buffer.CopyFromHost(b, []*int{nil}, s)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "*int")
	})
}

// Large host copies, staged and direct, into and out of every kind, at an
// unaligned offset, across the pool's wrap-around.
func TestCopyHostLarge(t *testing.T) {
	d, s, k := gpu(t)
	chunk, chunks, workers := buffer.StagingConfig()
	t.Cleanup(func() { require.NoError(t, buffer.ResetStaging(chunk, chunks, workers)) })
	configs := []struct {
		name                   string
		staged                 bool
		chunk, chunks, workers int
	}{
		{"direct", false, chunk, chunks, workers},
		{"staged", true, chunk, chunks, workers},
		{"staged-small-pool", true, 1 << 20, 2, 3},
	}
	for _, c := range configs {
		for _, kind := range kinds {
			t.Run(c.name+"/"+kind, func(t *testing.T) {
				require.NoError(t, buffer.ResetStaging(c.chunk, c.chunks, c.workers))
				defer buffer.SetStaging(c.staged)()
				n := uint64(5*c.chunk + 12345)
				owner := alloc(t, newResource(t, kind, d), n+3, s)
				b, err := owner.Slice(3, n)
				require.NoError(t, err)
				seed := uint32(len(c.name) + len(kind))

				src := cudatest.Pattern(int(n), seed)
				require.NoError(t, buffer.CopyFromHost(b, src, s))
				src[0] ^= 0xff // src may be reused as soon as the call returns
				k.RequireCheck(t, s, b.Ptr(), n, seed)

				require.NoError(t, k.Write(s, b.Ptr(), n, seed+1))
				got := make([]byte, n)
				require.NoError(t, buffer.CopyToHost(got, b, s))
				requireBytes(t, cudatest.Pattern(int(n), seed+1), got)

				// Below the staging threshold into a device.
				small, err := b.Slice(1, buffer.StageInMinBytes-1)
				require.NoError(t, err)
				require.NoError(t, buffer.CopyFromHost(small, cudatest.Pattern(buffer.StageInMinBytes-1, 9), s))
				k.RequireCheck(t, s, small.Ptr(), buffer.StageInMinBytes-1, 9)
			})
		}
	}
}

// Concurrent large copies share the staging pool (or fall back to the
// driver while it is busy), on one or two devices.
func TestCopyHostConcurrent(t *testing.T) {
	d := cudatest.Device(t)
	devs := []*cuda.Device{d}
	if all, err := cuda.Devices(); err == nil && len(all) > 1 {
		devs = all[:2]
	}
	defer buffer.SetStaging(true)()
	const n = 9<<20 + 5
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 6 {
		dev := devs[g%len(devs)]
		s := cudatest.Stream(t, dev)
		k := cudatest.LoadKernels(t, dev)
		b := alloc(t, &deviceResource{dev: dev}, n, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make([]byte, n)
			for round := range 3 {
				seed := uint32(g*10 + round)
				if err := buffer.CopyFromHost(b, cudatest.Pattern(n, seed), s); err != nil {
					errs <- err
					return
				}
				if m, err := k.Check(s, b.Ptr(), n, seed); err != nil || m != 0 {
					errs <- fmt.Errorf("goroutine %d round %d on %v: %d mismatches, %v", g, round, dev, m, err)
					return
				}
				if err := k.Write(s, b.Ptr(), n, seed+100); err != nil {
					errs <- err
					return
				}
				if err := buffer.CopyToHost(got, b, s); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, cudatest.Pattern(n, seed+100)) {
					errs <- fmt.Errorf("goroutine %d round %d on %v: read back differs", g, round, dev)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestBufferReadAtWriteAt(t *testing.T) {
	d, s, k := gpu(t)
	const n = 6<<20 + 100
	b := alloc(t, &deviceResource{dev: d}, n, s)
	want := cudatest.Pattern(n, 51)
	// Write in uneven pieces, the largest staged.
	for _, piece := range [][2]int{{0, 1000}, {1000, 5<<20 + 2000}, {5<<20 + 2000, n}} {
		m, err := b.WriteAt(want[piece[0]:piece[1]], int64(piece[0]))
		require.NoError(t, err)
		require.Equal(t, piece[1]-piece[0], m)
	}
	k.RequireCheck(t, s, b.Ptr(), n, 51)

	got, err := io.ReadAll(io.NewSectionReader(b, 0, n))
	require.NoError(t, err)
	requireBytes(t, want, got)

	p := make([]byte, 300)
	m, err := b.ReadAt(p, n-100)
	assert.Equal(t, 100, m)
	assert.Equal(t, io.EOF, err, "a short read at the end")
	assert.Equal(t, want[n-100:], p[:100])
	m, err = b.ReadAt(p, 12345)
	require.NoError(t, err)
	assert.Equal(t, 300, m)
	assert.Equal(t, want[12345:12645], p)
}

func TestBufferBytes(t *testing.T) {
	d, s, k := gpu(t)
	t.Run("pinned", func(t *testing.T) {
		b := alloc(t, &pinnedResource{dev: d}, 1<<16, s)
		require.NoError(t, k.Write(s, b.Ptr(), 1<<16, 61))
		require.NoError(t, s.Sync(), "synchronize before reading")
		p, err := b.Bytes()
		require.NoError(t, err)
		requireBytes(t, cudatest.Pattern(1<<16, 61), p)
		copy(p, cudatest.Pattern(1<<16, 62))
		k.RequireCheck(t, s, b.Ptr(), 1<<16, 62)
	})
	t.Run("unified", func(t *testing.T) {
		b := alloc(t, newResource(t, "unified", d), 1<<16, s)
		require.NoError(t, k.Write(s, b.Ptr(), 1<<16, 63))
		require.NoError(t, s.Sync())
		p, err := b.Bytes()
		require.NoError(t, err)
		requireBytes(t, cudatest.Pattern(1<<16, 63), p)
	})
	t.Run("device", func(t *testing.T) {
		b := alloc(t, &deviceResource{dev: d}, 64, s)
		_, err := b.Bytes()
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "not host-accessible")
	})
}

func TestBufferViews(t *testing.T) {
	d, s, k := gpu(t)
	owner := alloc(t, &deviceResource{dev: d}, 4096, s)
	require.NoError(t, owner.Fill8(0, s))
	v, err := owner.Slice(100, 1000)
	require.NoError(t, err)
	require.NoError(t, buffer.CopyFromHost(v, cudatest.Pattern(1000, 71), nil))
	k.RequireCheck(t, s, v.Ptr(), 1000, 71)
	vv, err := v.Slice(500, 500)
	require.NoError(t, err)
	require.NoError(t, vv.Fill8(0xee, nil))
	want := make([]byte, 4096)
	copy(want[100:600], cudatest.Pattern(500, 71))
	copy(want[600:1100], bytes.Repeat([]byte{0xee}, 500))
	requireHost(t, owner, s, want)
	require.NoError(t, v.Close())
	assert.ErrorIs(t, vv.Fill8(0, s), cuda.ErrClosed)
	assert.NoError(t, owner.Fill8(0, s), "the owner lives on")
}

// Borrowed buffers ask the driver where their memory lives.
func TestBufferBorrowed(t *testing.T) {
	d, s, k := gpu(t)
	dp, err := d.MemAlloc(4096)
	require.NoError(t, err)
	defer d.MemFree(dp)
	hp, err := d.MemHostAlloc(4096, cuda.MemHostAllocPortable)
	require.NoError(t, err)
	defer d.MemFreeHost(hp)
	mp, err := d.MemAllocManaged(4096, cuda.MemAttachGlobal)
	require.NoError(t, err)
	defer d.MemFree(mp)

	for _, c := range []struct {
		name       string
		p          cuda.DevicePtr
		dev        int
		devA, host bool
	}{
		{"device", dp, d.Ordinal(), true, false},
		{"pinned", cuda.DevicePtr(uintptr(hp)), -1, true, true},
		{"unified", mp, d.Ordinal(), true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := buffer.FromPointer(c.p, 4096)
			assert.False(t, b.IsOwned())
			assert.Equal(t, c.dev, b.DeviceID())
			assert.Equal(t, c.devA, b.DeviceAccessible())
			assert.Equal(t, c.host, b.HostAccessible())
			dev, err := b.Device()
			if c.dev < 0 {
				assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
			} else {
				require.NoError(t, err)
				assert.Same(t, d, dev)
			}
			require.NoError(t, buffer.CopyFromHost(b, cudatest.Pattern(4096, 81), s))
			k.RequireCheck(t, s, c.p, 4096, 81)
			require.NoError(t, b.Close(), "never frees")
			assert.ErrorIs(t, b.Fill8(0, s), cuda.ErrClosed)
		})
	}
	// Still allocated: the device can use it.
	require.NoError(t, s.MemsetD8Async(dp, 1, 4096))
	require.NoError(t, s.Sync())

	unknown := buffer.FromPointer(0x10, 16) // an address the driver does not know
	assert.Equal(t, -1, unknown.DeviceID())
	assert.False(t, unknown.DeviceAccessible())
	assert.False(t, unknown.HostAccessible())
}

// A nil stream is the allocation stream, else the legacy default stream.
func TestBufferNilStream(t *testing.T) {
	d, s, k := gpu(t)
	mr := &deviceResource{dev: d}
	onStream := alloc(t, mr, 1<<20, s)
	require.NoError(t, k.Write(s, onStream.Ptr(), 1<<20, 91))
	require.NoError(t, onStream.Fill32(0x5a5a5a5a, nil), "ordered after the kernel on s")
	requireHost(t, onStream, s, bytes.Repeat([]byte{0x5a}, 1<<20))

	noStream := alloc(t, mr, 1<<20, nil)
	assert.Nil(t, noStream.Stream())
	require.NoError(t, noStream.Fill8(0x3c, nil))
	require.NoError(t, d.DefaultStream().Sync())
	requireHost(t, noStream, nil, bytes.Repeat([]byte{0x3c}, 1<<20))

	pinned := alloc(t, &pinnedResource{dev: d}, 4096, nil)
	assert.Equal(t, -1, pinned.DeviceID())
	require.NoError(t, pinned.Fill8(7, nil), "host memory: device 0's default stream")
	requireHost(t, pinned, nil, bytes.Repeat([]byte{7}, 4096))
}

// Peer copies between two GPUs, checked by the destination device.
func TestBufferPeerCopy(t *testing.T) {
	ds := cudatest.Devices(t, 2)
	s0, s1 := cudatest.Stream(t, ds[0]), cudatest.Stream(t, ds[1])
	k0, k1 := cudatest.LoadKernels(t, ds[0]), cudatest.LoadKernels(t, ds[1])
	const n = 3<<20 + 7
	a := alloc(t, &deviceResource{dev: ds[0]}, n, s0)
	b := alloc(t, &deviceResource{dev: ds[1]}, n, s1)
	assert.Equal(t, 0, a.DeviceID())
	assert.Equal(t, 1, b.DeviceID())

	require.NoError(t, k0.Write(s0, a.Ptr(), n, 101))
	require.NoError(t, a.CopyTo(b, s0))
	require.NoError(t, s0.Sync())
	k1.RequireCheck(t, s1, b.Ptr(), n, 101)

	require.NoError(t, k1.Write(s1, b.Ptr(), n, 102))
	require.NoError(t, a.CopyFrom(b, s1), "on the source device's stream")
	require.NoError(t, s1.Sync())
	k0.RequireCheck(t, s0, a.Ptr(), n, 102)

	// Views at odd offsets, nil stream (the receiver's).
	av, err := a.Slice(1, n-1)
	require.NoError(t, err)
	bv, err := b.Slice(0, n-1)
	require.NoError(t, err)
	require.NoError(t, k0.Write(s0, av.Ptr(), n-1, 103))
	require.NoError(t, av.CopyTo(bv, nil))
	require.NoError(t, s0.Sync())
	k1.RequireCheck(t, s1, bv.Ptr(), n-1, 103)
	requireHost(t, bv, s1, cudatest.Pattern(n-1, 103))
}

// Dropped GPU buffers are freed by the safety net.
func TestLeaksGPU(t *testing.T) {
	d, s, _ := gpu(t)
	mr := &deviceResource{dev: d}
	free0, _, err := d.MemInfo()
	require.NoError(t, err)
	before := buffer.Leaks()
	dropOwned(mr, 256<<20)
	expectedLeaks.Add(1)
	collectUntil(t, "the dropped device buffer was not freed", func() bool {
		mr.mu.Lock()
		defer mr.mu.Unlock()
		return len(mr.frees) == 1
	})
	assert.Equal(t, before+1, buffer.Leaks())
	require.NoError(t, s.Sync())
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.InDelta(t, float64(free0), float64(free1), 64<<20, "the memory came back")
}

func TestErrorsAreWrapped(t *testing.T) {
	d, s, _ := gpu(t)
	b := alloc(t, &deviceResource{dev: d}, 16, s)
	_, err := b.Slice(8, 16)
	var oe *cuda.OpError
	require.True(t, errors.As(err, &oe))
	assert.Equal(t, "Buffer.Slice", oe.Op)
}
