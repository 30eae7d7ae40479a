package buffer_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// GPU tests of CopyBatch (they skip without a GPU, and fail instead with
// CUDAMEM_REQUIRE_GPU=1): TestGPUCopyBatchPath, TestGPUCopyBatchHtoD,
// TestGPUCopyBatchDtoD, TestGPUCopyBatchKinds, TestGPUCopyBatchWrongDevice
// (2 GPUs).

// batchModes are the paths and streams every data test runs on: the
// driver's batched call (or its loop on drivers before 12.8) and the
// forced loop, each on a stream of its own and on the legacy default
// stream (which always takes the loop).
var batchModes = []struct {
	name    string
	loop    bool
	deflt   bool
	batched bool // the batched call is used, where the driver has one
}{
	{"batched/own-stream", false, false, true},
	{"loop/own-stream", true, false, false},
	{"batched/legacy-default-stream", false, true, false},
	{"loop/legacy-default-stream", true, true, false},
}

func batchStream(t *testing.T, d *cuda.Device, own *cuda.Stream, deflt bool) *cuda.Stream {
	t.Helper()
	if deflt {
		return d.DefaultStream()
	}
	return own
}

// TestGPUCopyBatchPath checks the path chosen at load against the driver's
// version: CUDA 13 drivers take cuMemcpyBatchAsync_v2.
func TestGPUCopyBatchPath(t *testing.T) {
	d := cudatest.Device(t)
	_, v, err := cuda.Driver()
	require.NoError(t, err)
	p := d.MemcpyBatchPath()
	t.Logf("driver CUDA %s: %v", cuda.VersionString(v), p)
	switch {
	case v >= 13000:
		assert.Equal(t, cuda.MemcpyBatchV2, p)
	case v >= 12080:
		assert.Equal(t, cuda.MemcpyBatchV1, p)
	default:
		assert.Equal(t, cuda.MemcpyBatchLoop, p)
	}
}

// TestGPUCopyBatchHtoD: n pieces of a pinned buffer, of sizes 1 to 8 KiB
// at scattered offsets, to a device buffer in reverse order; read back.
func TestGPUCopyBatchHtoD(t *testing.T) {
	for _, m := range batchModes {
		t.Run(m.name, func(t *testing.T) {
			d, own, _ := gpu(t)
			s := batchStream(t, d, own, m.deflt)
			defer buffer.ForceBatchLoop(m.loop)()
			const size = 4 << 20
			src := alloc(t, newResource(t, "pinned", d), size, s)
			dst := alloc(t, newResource(t, "device", d), size, s)
			host, err := src.Bytes()
			require.NoError(t, err)
			copy(host, cudatest.Pattern(size, 11))
			require.NoError(t, dst.Fill8(0, s))

			var copies []buffer.Copy
			want := make([]byte, size)
			off := uint64(0)
			for i := 0; off < size/2; i++ {
				n := uint64(i*613%8192 + 1)
				if i%97 == 5 {
					n = 0 // empty copies are skipped
				}
				if off+n > size/2 {
					break
				}
				dOff := size - off - n
				copies = append(copies, buffer.Copy{Dst: dst, Src: src, DstOffset: dOff, SrcOffset: off, Size: n})
				copy(want[dOff:dOff+n], host[off:off+n])
				off += n
			}
			require.Greater(t, len(copies), 500)
			require.NoError(t, buffer.CopyBatch(s, copies))
			requireHost(t, dst, s, want)
		})
	}
}

// TestGPUCopyBatchDtoD: 4 KiB blocks of one device buffer to another in a
// shuffled order, then blocks of the second back onto the first's second
// half; checked on the device by the pattern kernel and read back.
func TestGPUCopyBatchDtoD(t *testing.T) {
	for _, m := range batchModes {
		t.Run(m.name, func(t *testing.T) {
			d, own, k := gpu(t)
			s := batchStream(t, d, own, m.deflt)
			defer buffer.ForceBatchLoop(m.loop)()
			const block, blocks = 4096, 2048
			const size = block * blocks
			mr := newResource(t, "device", d)
			a := alloc(t, mr, size, s)
			b := alloc(t, mr, size, s)
			require.NoError(t, k.Write(s, a.Ptr(), size, 7))

			// b's block j is a's block perm(j): a permutation of the blocks.
			perm := func(j uint64) uint64 { return j * 1237 % blocks }
			var copies []buffer.Copy
			for j := range uint64(blocks) {
				copies = append(copies, buffer.Copy{Dst: b, Src: a, DstOffset: j * block, SrcOffset: perm(j) * block, Size: block})
			}
			require.NoError(t, buffer.CopyBatch(s, copies))
			// Undo it into a's second half from b's blocks, in small pieces
			// of each block's first half.
			back := copies[:0:0]
			half := uint64(blocks / 2)
			for j := range uint64(blocks) {
				if p := perm(j); p >= half {
					back = append(back, buffer.Copy{Dst: a, Src: b, DstOffset: p * block, SrcOffset: j * block, Size: block / 2})
				}
			}
			require.NoError(t, buffer.CopyBatch(s, back))

			pat := cudatest.Pattern(size, 7)
			want := make([]byte, size)
			for j := range uint64(blocks) {
				copy(want[j*block:(j+1)*block], pat[perm(j)*block:(perm(j)+1)*block])
			}
			requireHost(t, b, s, want)
			// a is unchanged: the pieces copied back are its own bytes.
			k.RequireCheck(t, s, a.Ptr(), size, 7)
		})
	}
}

// TestGPUCopyBatchKinds: batches between every pair of the test resources
// (device, managed, pinned), one batch of mixed kinds too, on a stream of
// its own through the batched call.
func TestGPUCopyBatchKinds(t *testing.T) {
	d, s, _ := gpu(t)
	const size = 1 << 16
	bufs := map[string]*buffer.Buffer{}
	for _, kind := range kinds {
		bufs[kind] = alloc(t, newResource(t, kind, d), size, s)
	}
	for _, from := range kinds {
		for _, to := range kinds {
			t.Run(fmt.Sprintf("%s-to-%s", from, to), func(t *testing.T) {
				src := alloc(t, newResource(t, from, d), size, s)
				dst := alloc(t, newResource(t, to, d), size, s)
				seed := uint32(len(from)*3 + len(to))
				require.NoError(t, buffer.CopyFromHost(src, cudatest.Pattern(size, seed), s))
				require.NoError(t, dst.Fill8(0xee, s))
				var copies []buffer.Copy
				want := make([]byte, size)
				for i := range want {
					want[i] = 0xee
				}
				pat := cudatest.Pattern(size, seed)
				for i := range uint64(256) {
					n := uint64(64 + i%64)
					copies = append(copies, buffer.Copy{Dst: dst, Src: src, DstOffset: i * 256, SrcOffset: (255 - i) * 256, Size: n})
					copy(want[i*256:i*256+n], pat[(255-i)*256:(255-i)*256+n])
				}
				require.NoError(t, buffer.CopyBatch(s, copies))
				requireHost(t, dst, s, want)
			})
		}
	}
	t.Run("mixed", func(t *testing.T) {
		dev, mg, pin := bufs["device"], bufs["unified"], bufs["pinned"]
		require.NoError(t, buffer.CopyFromHost(pin, cudatest.Pattern(size, 1), s))
		require.NoError(t, buffer.CopyBatch(s, []buffer.Copy{
			{Dst: dev, Src: pin, Size: size / 2},
			{Dst: mg, Src: pin, DstOffset: size / 2, SrcOffset: size / 2, Size: size / 2},
		}))
		require.NoError(t, buffer.CopyBatch(s, []buffer.Copy{
			{Dst: mg, Src: dev, Size: size / 2},
		}))
		requireHost(t, mg, s, cudatest.Pattern(size, 1))
	})
}

// TestGPUCopyBatchWrongDevice (2 GPUs): a buffer of the other device is
// refused before anything is submitted, and the batch names it.
func TestGPUCopyBatchWrongDevice(t *testing.T) {
	ds := cudatest.Devices(t, 2)
	s0 := cudatest.Stream(t, ds[0])
	a := alloc(t, newResource(t, "device", ds[0]), 4096, s0)
	b := alloc(t, newResource(t, "device", ds[1]), 4096, nil)
	c := alloc(t, newResource(t, "device", ds[0]), 4096, s0)
	require.NoError(t, c.Fill8(0x11, s0))
	require.NoError(t, a.Fill8(0x22, s0))
	err := buffer.CopyBatch(s0, []buffer.Copy{{Dst: c, Src: a, Size: 4096}, {Dst: c, Src: b, Size: 16}})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	var be *cuda.BatchCopyError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 1, be.Index)
	assert.Contains(t, err.Error(), "is on GPU 1, the stream on GPU 0")
	want := make([]byte, 4096)
	for i := range want {
		want[i] = 0x11
	}
	requireHost(t, c, s0, want) // the valid first copy was not submitted either
}
