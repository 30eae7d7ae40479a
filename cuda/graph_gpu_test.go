package cuda_test

// GPU tests of stream capture and graphs (they skip without a GPU).

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// TestCaptureGraphKernelGPU captures a fill and a kernel on stream-ordered
// memory allocated before the capture, launches the graph many times and
// reads the result each time.
func TestCaptureGraphKernelGPU(t *testing.T) {
	d := cudatest.Device(t)
	k := cudatest.LoadKernels(t, d)
	s := cudatest.Stream(t, d)
	// The count is the process's: a fake-driver test of the safety net
	// leaks a graph on purpose.
	leaks := cuda.GraphLeaks()
	const words = 1 << 16
	p, err := s.MemAllocAsync(words * 4)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.MemFreeAsync(p)); assert.NoError(t, s.Sync()) })

	require.NoError(t, s.BeginCapture())
	assert.True(t, s.IsCapturing())
	st, id, err := s.CaptureID()
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusActive, st)
	assert.NotZero(t, id)
	require.NoError(t, s.MemsetD32Async(p, 10, words))
	require.NoError(t, k.Add(s, p, words, 7))
	g, err := s.EndCapture()
	require.NoError(t, err)
	assert.False(t, s.IsCapturing())
	e, err := g.Instantiate(0)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	out := make([]uint32, words)
	for i := range 50 {
		out[0], out[words-1] = 0, 0
		require.NoError(t, e.Launch(s), "launch %d", i)
		require.NoError(t, s.MemcpyDtoHAsync(unsafe.Pointer(&out[0]), p, words*4))
		require.NoError(t, s.Sync())
		for j, v := range out {
			if v != 17 {
				t.Fatalf("launch %d: word %d is %d, want 17", i, j, v)
			}
		}
	}
	require.NoError(t, e.Close())
	assert.Equal(t, leaks, cuda.GraphLeaks(), "no graph left to the safety net")
}

// TestCaptureInvalidatedGPU: in global mode, a cuMemAlloc on the
// capturing thread is refused by the driver and invalidates the capture;
// EndCapture reports it (ErrorStreamCaptureInvalidated), the capture is
// over and the stream works again. The relaxed default is immune.
func TestCaptureInvalidatedGPU(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	runtime.LockOSThread()
	require.NoError(t, s.BeginCaptureMode(cuda.CaptureModeGlobal))
	p, err := d.MemAlloc(64)
	if err == nil {
		assert.NoError(t, d.MemFree(p))
	}
	require.Error(t, err, "cuMemAlloc on a thread capturing in global mode")
	st, err := s.CaptureStatus()
	require.NoError(t, err)
	g, err := s.EndCapture()
	runtime.UnlockOSThread()
	if st == cuda.CaptureStatusActive {
		// Documented as invalidating; should a driver only refuse the
		// call, the capture must still end cleanly.
		t.Logf("the driver refused cuMemAlloc (%v) without invalidating the capture", err)
		require.NoError(t, err)
		require.NoError(t, g.Close())
	} else {
		assert.Equal(t, cuda.CaptureStatusInvalidated, st)
		assert.Nil(t, g)
		require.ErrorIs(t, err, cuda.ErrorStreamCaptureInvalidated)
	}
	assert.False(t, s.IsCapturing())
	require.NoError(t, s.Sync(), "the stream works again")

	require.NoError(t, s.BeginCapture())
	p, err = d.MemAlloc(64)
	require.NoError(t, err, "relaxed mode allows it")
	require.NoError(t, d.MemFree(p))
	g, err = s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
}

// TestCaptureRefusalsGPU: Sync on a capturing stream, and the legacy
// stream while a blocking stream captures, are refused before the driver
// sees them, so the capture survives; closing a capturing stream ends the
// capture.
func TestCaptureRefusalsGPU(t *testing.T) {
	d := cudatest.Device(t)
	s, err := d.NewStreamWith(0, 0) // blocking
	require.NoError(t, err)
	require.NoError(t, s.BeginCapture())
	require.ErrorIs(t, s.Sync(), cuda.ErrCapturing)
	require.ErrorIs(t, d.DefaultStream().Sync(), cuda.ErrCapturing)
	st, err := s.CaptureStatus()
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusActive, st)
	_, err = d.DefaultStream().CaptureStatus()
	assert.ErrorIs(t, err, cuda.ErrorStreamCaptureImplicit, "the driver's own answer for the legacy stream")
	require.NoError(t, s.Close(), "ends the capture, then destroys the stream")
	require.NoError(t, d.DefaultStream().Sync())
}

// BenchmarkCaptureCheck measures Stream.RefuseCapture, the check every
// resource makes on Allocate and Deallocate: on a stream made by
// NewStream (one atomic load) and on a borrowed stream (WrapStream: a
// cuStreamIsCapturing driver call).
func BenchmarkCaptureCheck(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	w, err := d.WrapStream(s.Handle())
	require.NoError(b, err)
	b.Run("owned", func(b *testing.B) {
		for b.Loop() {
			if s.RefuseCapture("bench") != nil {
				b.Fatal("capturing")
			}
		}
	})
	b.Run("borrowed", func(b *testing.B) {
		for b.Loop() {
			if w.RefuseCapture("bench") != nil {
				b.Fatal("capturing")
			}
		}
	})
}
