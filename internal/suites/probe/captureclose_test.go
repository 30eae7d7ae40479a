//go:build linux

package probe

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What Close and EndCapture of a stream may do to a capture in progress,
// and the synchronous copies on the legacy default stream (the capture
// rule, cuda/capturerule.go).

// foreignCapture begins a capture on a fresh stream (origin, standing in
// for foreign code's stream) and returns a borrowed value of that stream
// (as a framework's stream is wrapped), so that what cudamem records
// through the borrowed value belongs to a capture it did not see begin.
func foreignCapture(t *testing.T, d *cuda.Device) (origin, b *cuda.Stream) {
	t.Helper()
	origin = newStream(t, d)
	require.NoError(t, origin.BeginCapture())
	b, err := d.WrapStream(origin.Handle())
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return origin, b
}

// A stream that joined, by a wait, a capture cudamem did not see begin
// cannot end it: cuStreamEndCapture anywhere but on the stream that began
// a capture invalidates it. Close and EndCapture of the joined stream are
// refused with ErrCapturing (EndCapture also with ErrInvalidArgument, as
// for joins to captures cudamem began), the capture stays valid, and once
// it has ended both work again.
func TestJoinedForeignCaptureIsNotEndedByCloseOrEndCapture(t *testing.T) {
	d := dev(t, 0)
	check := baseline(t)
	origin, b := foreignCapture(t, d)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	require.NoError(t, e.Record(b))
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.WaitEvent(e), "a wait on a captured event forks the capture into s")
	require.True(t, s.IsCapturing())

	err = s.Close()
	require.ErrorIs(t, err, cuda.ErrCapturing)
	assert.Contains(t, err.Error(), "Stream.Close")
	assert.Contains(t, err.Error(), "joined the capture")
	assert.False(t, s.IsClosed(), "a refused Close leaves the stream open")
	_, err = s.EndCapture()
	require.ErrorIs(t, err, cuda.ErrCapturing)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "Stream.EndCapture")
	st, err := b.CaptureStatus()
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureStatusActive, st, "the foreign capture stays valid")

	require.NoError(t, b.WaitStream(s), "join s back into the origin")
	g, err := origin.EndCapture()
	require.NoError(t, err, "the foreign capture ends cleanly")
	require.NoError(t, g.Close())
	// The driver says the capture is over: s is free again.
	require.False(t, s.IsCapturing())
	require.NoError(t, s.Sync())
	require.NoError(t, s.Close())
	require.NoError(t, e.Close())
	require.NoError(t, b.Close())
	require.NoError(t, origin.Close())
	check()
}

// The same, asked only of Close: the joined capture ended without cudamem
// seeing it (the flag is stale), so Close asks the driver and destroys
// the stream.
func TestCloseStreamAfterJoinedForeignCaptureEnded(t *testing.T) {
	d := dev(t, 0)
	origin, b := foreignCapture(t, d)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.Record(b))
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.WaitEvent(e))
	require.NoError(t, b.WaitStream(s))
	g, err := origin.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
	require.NoError(t, s.Close(), "the capture s joined is over")
	require.True(t, s.IsClosed())
}

// Close of a borrowed stream value that began a capture is refused while
// the capture goes on: the stream is its owner's, so Close must not end
// the capture, and dropping the capture's count would let device-wide
// waits (Device.Sync) through, which invalidate it. EndCapture, or the
// capture ending through another value of the handle, lets Close through.
func TestCloseBorrowedStreamWhileItsCaptureRuns(t *testing.T) {
	d := dev(t, 1)
	own := newStream(t, d) // stands in for a framework's stream
	check := baseline(t)
	b, err := d.WrapStream(own.Handle())
	require.NoError(t, err)
	require.NoError(t, b.BeginCapture())

	err = b.Close()
	require.ErrorIs(t, err, cuda.ErrCapturing)
	assert.Contains(t, err.Error(), "Stream.Close")
	assert.Contains(t, err.Error(), "borrowed")
	assert.False(t, b.IsClosed())
	require.ErrorIs(t, d.RefuseDeviceWait("test"), cuda.ErrCapturing, "the capture is still counted")
	require.ErrorIs(t, d.Sync(), cuda.ErrCapturing)
	st, err := own.CaptureStatus()
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureStatusActive, st, "the capture is still valid")

	g, err := b.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
	require.NoError(t, b.Close())
	require.NoError(t, d.RefuseDeviceWait("test"))
	require.NoError(t, d.Sync())

	// Ended through another value of the same handle: Close asks the
	// driver, and the count goes with the capture.
	b, err = d.WrapStream(own.Handle())
	require.NoError(t, err)
	require.NoError(t, b.BeginCapture())
	b2, err := d.WrapStream(own.Handle())
	require.NoError(t, err)
	g, err = b2.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
	require.ErrorIs(t, d.RefuseDeviceWait("test"), cuda.ErrCapturing, "b's flag has not seen the end yet")
	require.NoError(t, b.Close())
	require.NoError(t, d.RefuseDeviceWait("test"), "no capture is counted once b saw it end")
	require.NoError(t, b2.Close())
	check()
}

// Device.MemcpyHtoD and MemcpyDtoH run on the legacy default stream, so
// while a blocking stream captures they would join and invalidate that
// capture: they are refused with ErrCapturing, as their async siblings on
// DefaultStream() are, and the capture stays valid.
func TestDeviceSyncCopiesRefusedWhileBlockingStreamCaptures(t *testing.T) {
	d := dev(t, 1)
	s, err := d.NewStreamWith(0, 0) // blocking
	require.NoError(t, err)
	defer s.Close()
	p, err := d.MemAlloc(64)
	require.NoError(t, err)
	defer d.MemFree(p)
	in := bytes.Repeat([]byte("sync copy"), 8)[:64]
	out := make([]byte, 64)

	require.NoError(t, s.BeginCapture())
	err = d.DefaultStream().MemcpyHtoDAsync(p, unsafe.Pointer(&in[0]), 64)
	require.ErrorIs(t, err, cuda.ErrCapturing, "the async sibling")
	err = d.MemcpyHtoD(p, unsafe.Pointer(&in[0]), 64)
	require.ErrorIs(t, err, cuda.ErrCapturing)
	assert.Contains(t, err.Error(), "Device.MemcpyHtoD")
	assert.Contains(t, err.Error(), "legacy default stream")
	err = d.MemcpyDtoH(unsafe.Pointer(&out[0]), p, 64)
	require.ErrorIs(t, err, cuda.ErrCapturing)
	assert.Contains(t, err.Error(), "Device.MemcpyDtoH")
	g, err := s.EndCapture()
	require.NoError(t, err, "the capture stayed valid")
	require.NoError(t, g.Close())

	// Without a blocking capture they run (a non-blocking stream's
	// capture does not involve the legacy stream).
	n := newStream(t, d)
	require.NoError(t, n.BeginCapture())
	require.NoError(t, d.MemcpyHtoD(p, unsafe.Pointer(&in[0]), 64))
	require.NoError(t, d.MemcpyDtoH(unsafe.Pointer(&out[0]), p, 64))
	assert.Equal(t, in, out)
	g, err = n.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
}
