//go:build linux

package probe

import (
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// raceCaptures runs capture n times while another goroutine runs other in
// a loop, and returns how many captures the driver invalidated (capture's
// error). The capture rule refuses other while a capture is in progress
// (ErrCapturing) and lets it run otherwise; a capture that began between
// the rule's check and other's driver call used to be invalidated by that
// call (the fake driver invalidates it as the real one does).
func raceCaptures(t *testing.T, n int, capture func() error, other func() error) (invalid int) {
	t.Helper()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := other(); err != nil {
				assert.ErrorIs(t, err, cuda.ErrCapturing, "refused by the rule, nothing else")
			}
		}
	}()
	for range n {
		if capture() != nil {
			invalid++
		}
	}
	close(stop)
	<-done
	return invalid
}

// captureOn returns a capture of s: begin, end, and close the graph; its
// error is EndCapture's (an invalidated capture).
func captureOn(t *testing.T, s *cuda.Stream) func() error {
	return func() error {
		require.NoError(t, s.BeginCapture())
		g, err := s.EndCapture()
		if err == nil {
			require.NoError(t, g.Close())
		}
		return err
	}
}

// A device-wide wait on one goroutine never invalidates a capture another
// goroutine begins: BeginCapture waits for a wait that passed the rule's
// check, and a wait that comes after it is refused.
func TestCaptureGateDeviceSync(t *testing.T) {
	d := dev(t, 1)
	s := newStream(t, d)
	assert.Zero(t, raceCaptures(t, 5000, captureOn(t, s), d.Sync), "captures invalidated by a concurrent Device.Sync")
}

// The same for work on the legacy default stream while a blocking stream
// begins capturing: it would join the capture and invalidate it.
func TestCaptureGateLegacyStream(t *testing.T) {
	d := dev(t, 1)
	s, err := d.NewStreamWith(0, 0) // blocking
	require.NoError(t, err)
	defer s.Close()
	assert.Zero(t, raceCaptures(t, 5000, captureOn(t, s), d.DefaultStream().Sync), "captures invalidated by a concurrent legacy-stream Sync")
}

// Synchronous copies run on the legacy stream: their check and their
// driver call are one step too, so a blocking stream's capture begun on
// another goroutine is never joined (and invalidated) by one.
func TestCaptureGateSyncCopies(t *testing.T) {
	d := dev(t, 1)
	s, err := d.NewStreamWith(0, 0) // blocking
	require.NoError(t, err)
	defer s.Close()
	p, err := d.MemAlloc(4096)
	require.NoError(t, err)
	defer d.MemFree(p)
	host := make([]byte, 4096)
	copyIn := func() error { return d.MemcpyHtoD(p, unsafe.Pointer(&host[0]), 4096) }
	assert.Zero(t, raceCaptures(t, 5000, captureOn(t, s), copyIn), "captures invalidated by a concurrent MemcpyHtoD")
}

// A capture of a non-blocking stream does not wait for legacy-stream work,
// which it leaves free: goroutines keeping the legacy stream busy cannot
// hold it off (it waited for them, and starved).
func TestCaptureGateNonBlockingIgnoresLegacy(t *testing.T) {
	d := dev(t, 1)
	s := newStream(t, d)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				assert.NoError(t, d.DefaultStream().Sync(), "the legacy stream is free while a non-blocking stream captures")
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			if !assert.NoError(t, s.BeginCapture()) {
				return
			}
			g, err := s.EndCapture()
			if assert.NoError(t, err) {
				assert.NoError(t, g.Close())
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Error("BeginCapture is held off by legacy-stream work")
	}
	close(stop)
	wg.Wait()
	<-done
}

// A blocking stream joining a capture (a wait on the capture's work) is
// kept apart from legacy-stream work as a blocking stream beginning one
// is: legacy-stream calls already past their check finish first, and the
// later ones are refused, so none joins (and invalidates) the capture.
func TestCaptureGateBlockingJoin(t *testing.T) {
	d := dev(t, 1)
	a := newStream(t, d) // the origin, non-blocking
	b, err := d.NewStreamWith(0, 0)
	require.NoError(t, err)
	defer b.Close()
	join := func() error {
		require.NoError(t, a.BeginCapture())
		require.NoError(t, b.WaitStream(a), "b joins a's capture")
		werr := a.WaitStream(b) // joined back
		g, err := a.EndCapture()
		if g != nil {
			require.NoError(t, g.Close())
		}
		return errors.Join(werr, err)
	}
	invalid := raceCaptures(t, 3000, join, d.DefaultStream().Sync)
	assert.Zero(t, invalid, "captures invalidated by legacy-stream work racing a join")
}
