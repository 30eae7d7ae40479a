//go:build linux

package probe

import (
	"errors"
	"sync"
	"sync/atomic"
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

// The legacy default stream cannot join a capture: a wait of it on work
// recorded into a non-blocking stream's capture (WaitEvent, WaitStream,
// and RefuseOrder for the layers above) is refused with ErrCapturing
// before the driver sees it, which would answer
// CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidate the capture. The
// capture stays valid, and once it is over the same waits run.
func TestLegacyStreamCannotJoinCapture(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	check := baseline(t)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	legacy := d.DefaultStream()
	wrapped, err := d.WrapStream(0)
	require.NoError(t, err)

	require.NoError(t, s.BeginCapture())
	require.NoError(t, e.Record(s), "recorded into the capture")
	for name, wait := range map[string]func() error{
		"Stream.WaitEvent":           func() error { return legacy.WaitEvent(e) },
		"Stream.WaitStream":          func() error { return legacy.WaitStream(s) },
		"Stream.WaitEvent (wrapped)": func() error { return wrapped.WaitEvent(e) },
		"RefuseOrder":                func() error { return cuda.RefuseOrder("RefuseOrder", legacy, s) },
	} {
		err := wait()
		require.ErrorIs(t, err, cuda.ErrCapturing, name)
		assert.NotErrorIs(t, err, cuda.ErrorStreamCaptureImplicit, "%s: refused before the driver", name)
		assert.Contains(t, err.Error(), "legacy default stream", name)
		assert.False(t, legacy.IsCapturing(), "%s: the legacy stream joined nothing", name)
	}
	require.NoError(t, legacy.Sync(), "the legacy stream is free while a non-blocking stream captures")
	g, err := s.EndCapture()
	require.NoError(t, err, "the capture stays valid")
	require.NoError(t, g.Close())

	require.NoError(t, legacy.WaitEvent(e), "after the capture the wait runs")
	require.NoError(t, legacy.WaitStream(s))
	require.NoError(t, legacy.Sync())
	require.NoError(t, e.Close())
	check()
}

// A capture begins within a bounded time however many callers it refuses:
// goroutines retrying Device.Sync, legacy-stream work and synchronous
// copies as fast as they are refused used to keep a capture from starting
// for seconds at a time (every refused call counted as a call in flight,
// and the capture waited for the count to be exactly zero). Every
// BeginCapture of blocking and non-blocking streams returns, and no
// capture is invalidated by the calls it let through.
func TestCaptureGateFairUnderRetries(t *testing.T) {
	d := dev(t, 1)
	s := newStream(t, d)
	b, err := d.NewStreamWith(0, 0) // blocking: refuses legacy-stream work too
	require.NoError(t, err)
	defer b.Close()
	p, err := d.MemAlloc(64)
	require.NoError(t, err)
	defer d.MemFree(p)
	host := make([]byte, 64)
	legacy := d.DefaultStream()
	calls := []func() error{
		d.Sync,
		legacy.Sync,
		func() error { return d.MemcpyHtoD(p, unsafe.Pointer(&host[0]), 64) },
		func() error { return legacy.MemsetD8Async(p, 1, 64) },
		func() error {
			_, err := legacy.CaptureStatus()
			if errors.Is(err, cuda.ErrorStreamCaptureImplicit) {
				return nil // the driver's answer while a blocking stream captures; harmless
			}
			return err
		},
	}
	const callers = 8
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var made [callers]atomic.Int64
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call := calls[i%len(calls)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := call(); err != nil && !errors.Is(err, cuda.ErrCapturing) {
					t.Errorf("refused by the rule, nothing else: %v", err)
					return
				}
				made[i].Add(1)
			}
		}()
	}
	// Every caller is in its loop before the captures begin.
	for i := range callers {
		for made[i].Load() < 100 && !t.Failed() {
			time.Sleep(time.Millisecond)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 400 {
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

// A stream of another context that joins a capture (a wait on its work)
// is capturing in its own context: a wait for that whole context would
// invalidate the capture, and is refused until the capture ends, as for
// the context the capture began in.
func TestCaptureJoinedFromAnotherContext(t *testing.T) {
	d0, d1 := dev(t, 0), dev(t, 1)
	a, b := newStream(t, d0), newStream(t, d1)
	check := baseline(t)
	require.NoError(t, a.BeginCapture())
	require.NoError(t, b.WaitStream(a), "b joins a's capture")
	require.True(t, b.IsCapturing())
	err := d1.Sync()
	require.ErrorIs(t, err, cuda.ErrCapturing, "a wait for b's context would invalidate the capture")
	require.ErrorIs(t, d1.RefuseDeviceWait("test"), cuda.ErrCapturing)
	require.NoError(t, a.WaitStream(b), "joined back")
	g, err := a.EndCapture()
	require.NoError(t, err, "the capture stays valid")
	require.NoError(t, g.Close())
	require.False(t, b.IsCapturing())
	require.NoError(t, d1.Sync(), "free again once the capture is over")
	check()
}

// The same race as TestCaptureGateDeviceSync for a join from another
// context: a Device.Sync of the joining stream's context already past its
// check finishes before the join, and the later ones are refused.
func TestCaptureGateCrossContextJoin(t *testing.T) {
	d0, d1 := dev(t, 0), dev(t, 1)
	a, b := newStream(t, d0), newStream(t, d1)
	join := func() error {
		require.NoError(t, a.BeginCapture())
		require.NoError(t, b.WaitStream(a), "b joins a's capture")
		werr := a.WaitStream(b)
		g, err := a.EndCapture()
		if g != nil {
			require.NoError(t, g.Close())
		}
		return errors.Join(werr, err)
	}
	assert.Zero(t, raceCaptures(t, 3000, join, d1.Sync), "captures invalidated by a wait for the joining stream's context")
}
