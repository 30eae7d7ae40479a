package cuda_test

// GPU tests of the capture gate (they skip without a GPU): the legacy
// default stream never joins a capture, a capture begins however many
// callers it refuses, and a stream of another device that joins a capture
// makes its device count as capturing.

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// TestLegacyStreamCannotJoinCaptureGPU: the legacy default stream waiting
// on work recorded into a non-blocking stream's capture is refused with
// ErrCapturing before the driver (which answers
// CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates the capture); the
// capture ends cleanly, and afterwards the waits run.
func TestLegacyStreamCannotJoinCaptureGPU(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer e.Close()
	legacy := d.DefaultStream()

	require.NoError(t, s.BeginCapture())
	require.NoError(t, e.Record(s))
	for name, err := range map[string]error{
		"WaitEvent":   legacy.WaitEvent(e),
		"WaitStream":  legacy.WaitStream(s),
		"RefuseOrder": cuda.RefuseOrder("RefuseOrder", legacy, s),
	} {
		require.ErrorIs(t, err, cuda.ErrCapturing, name)
		assert.NotErrorIs(t, err, cuda.ErrorStreamCaptureImplicit, name)
	}
	st, err := s.CaptureStatus()
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureStatusActive, st, "the capture stays valid")
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
	// The event's record above was a node of the graph, not a record:
	// record it for real before waiting on it.
	require.NoError(t, e.Record(s))
	require.NoError(t, legacy.WaitEvent(e))
	require.NoError(t, legacy.WaitStream(s))
	require.NoError(t, legacy.Sync())
}

// TestCaptureGateFairUnderRetriesGPU: goroutines retrying Device.Sync and
// legacy-stream work as fast as they are refused do not hold captures
// off (they did for 30 s and more), and invalidate none.
func TestCaptureGateFairUnderRetriesGPU(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	b, err := d.NewStreamWith(0, 0) // blocking
	require.NoError(t, err)
	defer b.Close()
	legacy := d.DefaultStream()
	calls := []func() error{d.Sync, legacy.Sync}
	const callers = 4
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var made [callers]atomic.Int64
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := calls[i%len(calls)](); err != nil && !errors.Is(err, cuda.ErrCapturing) {
					t.Errorf("refused by the rule, nothing else: %v", err)
					return
				}
				made[i].Add(1)
			}
		}()
	}
	for i := range callers {
		for made[i].Load() < 100 && !t.Failed() {
			time.Sleep(time.Millisecond)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			st := s
			if i%2 == 1 {
				st = b
			}
			if !assert.NoError(t, st.BeginCapture()) {
				return
			}
			g, err := st.EndCapture()
			if !assert.NoError(t, err, "capture %d invalidated", i) {
				return
			}
			assert.NoError(t, g.Close())
		}
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute): // a hang detector, not a measure
		t.Error("BeginCapture is held off by the calls it refuses")
	}
	close(stop)
	wg.Wait()
	<-done
}

// TestCaptureJoinedFromAnotherDeviceGPU: a stream of a second GPU that
// joins a capture by a wait is capturing in its own context, so
// Device.Sync of that GPU is refused (it would invalidate the capture)
// until the capture ends. Skips on one GPU, and where the driver does not
// join a stream of another device.
func TestCaptureJoinedFromAnotherDeviceGPU(t *testing.T) {
	ds := cudatest.Devices(t, 2)
	a, b := cudatest.Stream(t, ds[0]), cudatest.Stream(t, ds[1])
	require.NoError(t, a.BeginCapture())
	if err := b.WaitStream(a); err != nil {
		g, _ := a.EndCapture()
		if g != nil {
			g.Close()
		}
		t.Skipf("the driver does not join a stream of another device into a capture: %v", err)
	}
	require.True(t, b.IsCapturing())
	require.ErrorIs(t, ds[1].Sync(), cuda.ErrCapturing)
	require.NoError(t, a.WaitStream(b))
	g, err := a.EndCapture()
	require.NoError(t, err, "the capture stays valid")
	require.NoError(t, g.Close())
	require.NoError(t, ds[1].Sync())
}
