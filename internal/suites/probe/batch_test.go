//go:build linux

package probe

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
	_ "unsafe" // for go:linkname

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
	"github.com/cudamem/cudamem/resource"
)

// forceBatchLoop is package cuda's test switch that sends every batch down
// the loop of cuMemcpyAsync (cuda/batch.go); restore puts the previous
// setting back.
//
//go:linkname forceBatchLoop github.com/cudamem/cudamem/cuda.forceBatchLoop
func forceBatchLoop(on bool) (restore func())

// envBatchPath names the path the batch tests expect, for the runs of this
// binary as an older driver (TestBatchCopyOlderDrivers); unset: the fake's
// default CUDA 13.0, so cuMemcpyBatchAsync_v2.
const envBatchPath = "PROBE_BATCH_PATH"

func wantBatchPath() cuda.MemcpyBatchPath {
	switch os.Getenv(envBatchPath) {
	case "loop":
		return cuda.MemcpyBatchLoop
	case "v1":
		return cuda.MemcpyBatchV1
	}
	return cuda.MemcpyBatchV2
}

// batchCalls reads how many batched calls the fake accepted at each ABI.
func batchCalls(t *testing.T) (v1, v2 int64) {
	t.Helper()
	lib, err := loader.OpenLibrary(os.Getenv("CUDAMEM_DRIVER"))
	require.NoError(t, err)
	p, err := lib.Lookup("fakecuda_batch_calls")
	require.NoError(t, err)
	return int64(p.Call(0)), int64(p.Call(1))
}

// expectBatchCalls checks which ABI took the batches submitted since the
// counts (v1, v2) were read: n batches on path, none on the other.
func expectBatchCalls(t *testing.T, v1, v2 int64, path cuda.MemcpyBatchPath, n int64) {
	t.Helper()
	g1, g2 := batchCalls(t)
	switch path {
	case cuda.MemcpyBatchV1:
		assert.Equal(t, v1+n, g1, "12.8 ABI calls")
		assert.Equal(t, v2, g2, "13.0 ABI calls")
	case cuda.MemcpyBatchV2:
		assert.Equal(t, v1, g1, "12.8 ABI calls")
		assert.Equal(t, v2+n, g2, "13.0 ABI calls")
	default:
		assert.Equal(t, v1, g1, "12.8 ABI calls (loop expected)")
		assert.Equal(t, v2, g2, "13.0 ABI calls (loop expected)")
	}
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7) ^ seed
	}
	return p
}

// TestBatchCopyData copies many pieces of different sizes and offsets,
// host to device from a pinned buffer, device to device and device to
// host, and reads every byte back, on each kind of stream and path.
func TestBatchCopyData(t *testing.T) {
	d0 := dev(t, 0)
	want := wantBatchPath()
	require.Equal(t, want, d0.MemcpyBatchPath(), "the path chosen at load for driver %s", os.Getenv("FAKECUDA_VERSION"))
	pinned, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	sd, err := resource.NewSyncDevice(d0)
	require.NoError(t, err)
	own, err := d0.NewStream()
	require.NoError(t, err)
	defer own.Close()

	for _, tc := range []struct {
		name     string
		stream   *cuda.Stream
		loop     bool // force the loop
		wantPath cuda.MemcpyBatchPath
	}{
		{"own stream", own, false, want},
		{"own stream, forced loop", own, true, cuda.MemcpyBatchLoop},
		{"legacy default stream", d0.DefaultStream(), false, cuda.MemcpyBatchLoop},
		{"nil stream (the destination's: legacy default)", nil, false, cuda.MemcpyBatchLoop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer baseline(t)()
			defer forceBatchLoop(tc.loop)()
			const n, size = 300, 64 << 10
			src, err := pinned.Allocate(size, nil)
			require.NoError(t, err)
			mid, err := sd.Allocate(size, nil)
			require.NoError(t, err)
			back, err := pinned.Allocate(size, nil)
			require.NoError(t, err)
			defer closeAll(t, src, mid, back)
			host, err := src.Bytes()
			require.NoError(t, err)
			copy(host, pattern(size, 0x5a))
			out, err := back.Bytes()
			require.NoError(t, err)
			clear(out)

			// Copy i moves len_i bytes from offset a_i of src to offset b_i
			// of mid, pieces laid out without overlap; some are empty.
			var hd, dd, dh []buffer.Copy
			off := uint64(0)
			for i := range n {
				l := uint64(i*37%200 + 1)
				if i%50 == 7 {
					l = 0
				}
				hd = append(hd, buffer.Copy{Dst: mid, Src: src, DstOffset: size - off - l, SrcOffset: off, Size: l})
				off += l
			}
			require.Less(t, off, uint64(size/2), "the front and back halves do not overlap")
			// Device to device within mid: the back part to the front.
			dd = append(dd, buffer.Copy{Dst: mid, Src: mid, DstOffset: 0, SrcOffset: size - off, Size: off})
			// Device to host into back, in 4 KiB pieces.
			for o := uint64(0); o < size; o += 4096 {
				dh = append(dh, buffer.Copy{Dst: back, Src: mid, DstOffset: o, SrcOffset: o, Size: 4096})
			}
			v1, v2 := batchCalls(t)
			for _, b := range [][]buffer.Copy{hd, dd, dh} {
				require.NoError(t, buffer.CopyBatch(tc.stream, b))
			}
			s := tc.stream
			if s == nil {
				s = d0.DefaultStream()
			}
			require.NoError(t, s.Sync())
			expectBatchCalls(t, v1, v2, tc.wantPath, 3)

			// The expected device contents: the reversed layout, then its
			// tail copied to the front.
			exp := make([]byte, size)
			for _, c := range hd {
				copy(exp[c.DstOffset:c.DstOffset+c.Size], host[c.SrcOffset:c.SrcOffset+c.Size])
			}
			copy(exp[:off], exp[size-off:])
			// Bytes nothing wrote are whatever the allocation held: compare
			// only what the batches wrote.
			assert.True(t, bytes.Equal(exp[:off], out[:off]), "front (device to device)")
			assert.True(t, bytes.Equal(exp[size-off:], out[size-off:]), "back (host to device)")
		})
	}
}

// TestBatchCopyViewsAndManaged copies between views and managed memory.
func TestBatchCopyViewsAndManaged(t *testing.T) {
	defer baseline(t)()
	d0 := dev(t, 0)
	mg, err := resource.NewManaged(d0, nil)
	require.NoError(t, err)
	dp, err := resource.CurrentDevicePool(d0)
	require.NoError(t, err)
	defer dp.Close()
	s, err := d0.NewStream()
	require.NoError(t, err)
	defer s.Close()
	a, err := mg.Allocate(8192, s)
	require.NoError(t, err)
	b, err := dp.Allocate(8192, s)
	require.NoError(t, err)
	c, err := mg.Allocate(8192, s)
	require.NoError(t, err)
	defer closeAll(t, a, b, c)
	ha, err := a.Bytes()
	require.NoError(t, err)
	copy(ha, pattern(8192, 3))
	va, err := a.Slice(4096, 4096)
	require.NoError(t, err)
	vb, err := b.Slice(1000, 5000)
	require.NoError(t, err)
	require.NoError(t, buffer.CopyBatch(s, []buffer.Copy{
		{Dst: vb, Src: va, DstOffset: 10, SrcOffset: 20, Size: 100}, // b[1010:1110] = a[4116:4216]
		{Dst: b, Src: a, Size: 1000},                                // b[0:1000] = a[0:1000]
	}))
	require.NoError(t, buffer.CopyBatch(s, []buffer.Copy{{Dst: c, Src: b, Size: 1110}}))
	require.NoError(t, s.Sync())
	hc, err := c.Bytes()
	require.NoError(t, err)
	assert.Equal(t, ha[:1000], hc[:1000])
	assert.Equal(t, ha[4116:4216], hc[1010:1110])
}

// TestBatchCopyDriverErrors: failures only the driver sees name the copy
// where the driver says which (the loop, and the 12.8 ABI's failIdx), and
// the batch as a whole on the 13.0 ABI.
func TestBatchCopyDriverErrors(t *testing.T) {
	defer baseline(t)()
	d0 := dev(t, 0)
	path := wantBatchPath()
	sd, err := resource.NewSyncDevice(d0)
	require.NoError(t, err)
	s, err := d0.NewStream()
	require.NoError(t, err)
	defer s.Close()
	a, err := sd.Allocate(4096, nil)
	require.NoError(t, err)
	defer closeAll(t, a)
	// A borrowed buffer that claims more than the allocation holds: Go
	// cannot tell, the driver can.
	over := buffer.FromPointer(a.Ptr(), 8192)
	ok := buffer.Copy{Dst: a, Src: a, SrcOffset: 2048, Size: 16}
	empty := buffer.Copy{Dst: a, Src: a, Size: 0}
	bad := buffer.Copy{Dst: over, Src: a, DstOffset: 4090, Size: 100}
	for _, loop := range []bool{false, true} {
		t.Run(fmt.Sprintf("loop=%v", loop), func(t *testing.T) {
			defer forceBatchLoop(loop)()
			err := buffer.CopyBatch(s, []buffer.Copy{ok, empty, empty, bad, ok})
			require.Error(t, err)
			assert.ErrorIs(t, err, cuda.ErrorInvalidValue)
			var be *cuda.BatchCopyError
			if loop || path != cuda.MemcpyBatchV2 {
				require.ErrorAs(t, err, &be, "%v", err)
				assert.Equal(t, 3, be.Index, "the caller's index, past the empty copies: %v", err)
				assert.Equal(t, 5, be.Count)
				assert.Contains(t, err.Error(), "copy 3 of 5")
			} else {
				assert.False(t, errors.As(err, &be), "the 13.0 ABI names no copy: %v", err)
				assert.Contains(t, err.Error(), "batch of 5 copies, 3 of them non-empty")
			}
			op := "cuMemcpyBatchAsync"
			if loop || path == cuda.MemcpyBatchLoop {
				op = "cuMemcpyAsync"
			}
			assert.Contains(t, err.Error(), op)
			t.Log(err)
		})
	}
}

func TestBatchCopyStreamChecks(t *testing.T) {
	defer baseline(t)()
	d0, d1 := dev(t, 0), dev(t, 1)
	sd0, err := resource.NewSyncDevice(d0)
	require.NoError(t, err)
	sd1, err := resource.NewSyncDevice(d1)
	require.NoError(t, err)
	a, err := sd0.Allocate(256, nil)
	require.NoError(t, err)
	b, err := sd1.Allocate(256, nil)
	require.NoError(t, err)
	defer closeAll(t, a, b)
	s0, err := d0.NewStream()
	require.NoError(t, err)
	defer s0.Close()

	v1, v2 := batchCalls(t)
	err = buffer.CopyBatch(s0, []buffer.Copy{{Dst: a, Src: a, Size: 8, DstOffset: 8}, {Dst: a, Src: b, Size: 8}})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	var be *cuda.BatchCopyError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 1, be.Index)
	assert.Contains(t, err.Error(), "is on GPU 1, the stream on GPU 0")
	// A nil stream is the first destination's: device 1's legacy stream.
	err = buffer.CopyBatch(nil, []buffer.Copy{{Dst: b, Src: b, Size: 8, DstOffset: 8}, {Dst: b, Src: a, Size: 8}})
	require.ErrorAs(t, err, &be)
	assert.Contains(t, err.Error(), "is on GPU 0, the stream on GPU 1")

	closed, err := d0.NewStream()
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	err = buffer.CopyBatch(closed, []buffer.Copy{{Dst: a, Src: a, Size: 8, DstOffset: 8}})
	assert.ErrorIs(t, err, cuda.ErrClosed)
	expectBatchCalls(t, v1, v2, cuda.MemcpyBatchLoop, 0) // nothing submitted

	// The raw form checks the same things before the driver.
	err = s0.MemcpyBatchAsync([]cuda.DevicePtr{a.Ptr()}, []cuda.DevicePtr{a.Ptr() + 8}, []uint64{8},
		[]cuda.MemcpyAttributes{{SrcAccessOrder: 9}}, []uint64{0})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "SrcAccessOrder is 9")
	require.NoError(t, s0.MemcpyBatchAsync([]cuda.DevicePtr{a.Ptr()}, []cuda.DevicePtr{a.Ptr() + 8}, []uint64{8},
		[]cuda.MemcpyAttributes{{SrcAccessOrder: cuda.MemcpySrcAccessOrderAny, Flags: cuda.MemcpyFlagPreferOverlapWithCompute}}, []uint64{0}))
	require.NoError(t, s0.MemcpyBatchAsync(nil, nil, nil, nil, nil))
	require.NoError(t, s0.MemcpyBatchAsync([]cuda.DevicePtr{0}, []cuda.DevicePtr{0}, []uint64{0}, nil, nil), "only empty copies: a no-op")
}

// Batches and Closes in every order on shared buffers, on the fake: no
// deadlock, no use of freed memory, counters back to zero (run with -race).
func TestBatchCopyConcurrentClose(t *testing.T) {
	defer baseline(t)()
	d0 := dev(t, 0)
	sd, err := resource.NewSyncDevice(d0)
	require.NoError(t, err)
	s, err := d0.NewStream()
	require.NoError(t, err)
	defer s.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			a, err := sd.Allocate(4096, nil)
			require.NoError(t, err)
			b, err := sd.Allocate(4096, nil)
			require.NoError(t, err)
			copies := []buffer.Copy{
				{Dst: a, Src: b, Size: 64}, {Dst: b, Src: a, Size: 64, DstOffset: 1024, SrcOffset: 1024},
				{Dst: a, Src: a, Size: 64, DstOffset: 2048}, {Dst: a, Src: b, Size: 64, DstOffset: 3072},
			}
			var wg, started sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				started.Add(1)
				go func() {
					defer wg.Done()
					mine := append([]buffer.Copy(nil), copies[g:]...)
					mine = append(mine, copies[:g]...)
					for k := range 50 {
						if k == 1 {
							started.Done() // the Closes start once every goroutine got going
						}
						if err := buffer.CopyBatch(s, mine); err != nil {
							if !errors.Is(err, cuda.ErrClosed) {
								t.Errorf("CopyBatch: %v", err)
							}
							return
						}
					}
				}()
			}
			started.Wait()
			wg.Add(2)
			go func() { defer wg.Done(); assert.NoError(t, b.Close()) }()
			go func() { defer wg.Done(); assert.NoError(t, a.Close()) }()
			wg.Wait()
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("deadlock: CopyBatch and Close did not finish in 60 s")
	}
	require.NoError(t, s.Sync())
}

// TestBatchCopyOlderDrivers reruns the batch tests with the fake posing
// as CUDA 12.6 (no batched copy: the loop) and 12.8 (the failIdx ABI).
func TestBatchCopyOlderDrivers(t *testing.T) {
	if os.Getenv(envBatchPath) != "" {
		t.Skip("already the child")
	}
	for _, tc := range []struct{ version, path string }{{"12060", "loop"}, {"12080", "v1"}, {"12090", "v1"}} {
		t.Run(tc.version, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestBatchCopy(Data|DriverErrors|StreamChecks)$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "FAKECUDA_VERSION="+tc.version, envBatchPath+"="+tc.path)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			for _, name := range []string{"TestBatchCopyData", "TestBatchCopyDriverErrors", "TestBatchCopyStreamChecks"} {
				assert.True(t, strings.Contains(string(out), "--- PASS: "+name), "%s did not pass as CUDA %s:\n%s", name, tc.version, out)
			}
		})
	}
}
