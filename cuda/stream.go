package cuda

import (
	"fmt"
	"unsafe"
)

// Stream is a CUDA stream of one device's context. Work submitted to a
// stream runs in order; different streams may overlap. A Stream from
// Device.NewStream is owned: Close destroys it, and any use after Close
// returns an error matching ErrClosed. Device.DefaultStream is the legacy
// default stream (handle 0), never destroyed; the per-thread default
// stream is never used, since goroutines are not threads. A Stream from
// Device.WrapStream is borrowed: its Close only stops its use here.
//
// Methods are safe for concurrent use, but closing a stream while other
// goroutines still submit work to it is a program error (as in CUDA).
type Stream struct {
	dev      *Device
	handle   uintptr
	owned    bool
	borrowed bool // from WrapStream: never destroyed here

	guard Guard // calls in flight, then Close

	waiter waiter // the blocking wait SyncContext callers share

	// capture is the stream's part in the capture rule (capturerule.go).
	capture streamCapture
	// diedErr is what Close reports, each time, for an owned stream
	// closed after Context.Close destroyed its green context
	// (Device.diedWith). Written under the guard's Lock.
	diedErr error
}

// NewStream creates a non-blocking stream (it does not synchronize with
// the legacy default stream) with default priority.
func (d *Device) NewStream() (*Stream, error) { return d.NewStreamWith(StreamNonBlocking, 0) }

// NewStreamWith creates a stream with the given flags and priority (lower
// numbers are higher priority; see StreamPriorityRange).
func (d *Device) NewStreamWith(flags StreamFlags, priority int) (*Stream, error) {
	ctx, err := d.contextFor("Device.NewStreamWith")
	if err != nil {
		return nil, err
	}
	s := &Stream{dev: d, owned: true}
	s.capture.blocking = flags&StreamNonBlocking == 0
	if g := d.green(); g != 0 {
		// A green context's streams come from cuGreenCtxStreamCreate,
		// which takes non-blocking streams only.
		if flags&StreamNonBlocking == 0 {
			return nil, Errorf("Device.NewStreamWith", ErrInvalidArgument, "streams of green context %#x must be StreamNonBlocking (flags %#x)", g, uint32(flags))
		}
		p := &d.drv.GreenCtxStreamCreate
		if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&s.handle)), g, uintptr(flags), uintptr(int64(priority))); !ok(r) {
			return nil, &OpError{Op: "Device.NewStreamWith", Err: fmt.Errorf("green context %#x, flags %#x, priority %d: %w", g, uint32(flags), priority, fail(p, r))}
		}
		if s.handle == 0 {
			return nil, zeroHandleErr("Device.NewStreamWith", "cuGreenCtxStreamCreate", "stream handle")
		}
		streamCreated(s)
		return s, nil
	}
	r := d.drv.StreamCreateWithPriority.CallCtx(ctx, uintptr(unsafe.Pointer(&s.handle)), uintptr(flags), uintptr(int64(priority)))
	if !ok(r) {
		return nil, fail(&d.drv.StreamCreateWithPriority, r)
	}
	if s.handle == 0 {
		// Handle 0 is the legacy default stream: an owned stream with it
		// would have Close hand it to cuStreamDestroy.
		return nil, zeroHandleErr("Device.NewStreamWith", "cuStreamCreateWithPriority", "stream handle")
	}
	streamCreated(s)
	return s, nil
}

// StreamPriorityRange returns the device's stream priorities: least is the
// lowest priority (numerically greatest), greatest the highest.
func (d *Device) StreamPriorityRange() (least, greatest int, err error) {
	ctx, err := d.contextFor("Device.StreamPriorityRange")
	if err != nil {
		return 0, 0, err
	}
	var lo, hi int32
	if r := d.drv.CtxGetStreamPriorityRange.CallCtx(ctx, uintptr(unsafe.Pointer(&lo)), uintptr(unsafe.Pointer(&hi))); !ok(r) {
		return 0, 0, fail(&d.drv.CtxGetStreamPriorityRange, r)
	}
	return int(lo), int(hi), nil
}

// Device is the device the stream belongs to (nil for a nil stream).
func (s *Stream) Device() *Device {
	if s == nil {
		return nil
	}
	return s.dev
}

// Handle is the CUstream handle: 0 for the legacy default stream, and 0
// for a nil, zero or closed Stream, so a destroyed handle is never handed
// out. Since 0 is also a valid handle (the legacy default stream), use
// HandleErr where a closed stream must be told apart. The handle is valid
// only while the stream stays open.
func (s *Stream) Handle() uintptr {
	if s == nil || s.guard.IsClosed() {
		return 0
	}
	return s.handle
}

// HandleErr is Handle with an error: it matches cuda.ErrClosed for a
// closed Stream and cuda.ErrInvalidArgument for a nil or zero one. A nil
// error with handle 0 is the legacy default stream.
func (s *Stream) HandleErr() (uintptr, error) {
	const op = "Stream.HandleErr"
	switch {
	case s == nil || s.dev == nil:
		return 0, errZeroStream(op)
	case s.guard.IsClosed():
		return 0, &OpError{Op: op, Err: fmt.Errorf("%w: stream of %v", ErrClosed, s.dev)}
	}
	return s.handle, nil
}

// IsDefault reports whether s is a legacy default stream.
func (s *Stream) IsDefault() bool { return s != nil && !s.owned && !s.borrowed }

// IsBorrowed reports whether s came from WrapStream: a stream cudamem
// did not create and never destroys.
func (s *Stream) IsBorrowed() bool { return s != nil && s.borrowed }

// IsClosed reports whether Close was called on an owned or borrowed
// stream (true for a nil Stream; a default stream is never closed).
func (s *Stream) IsClosed() bool { return s == nil || s.guard.IsClosed() }

// begin returns the context and handle for a call on s, holding it open
// until end, so Close cannot destroy the stream mid-call. On the legacy
// default stream it enters the gate (capturerule.go): refused with
// ErrCapturing while a blocking stream of its context captures.
func (s *Stream) begin(op string) (ctx, handle uintptr, err error) {
	if s == nil || s.dev == nil {
		return 0, 0, errZeroStream(op)
	}
	legacy := s.IsDefault()
	if legacy {
		if err := s.dev.refuseLegacy(op); err != nil {
			return 0, 0, err
		}
	}
	ctx, handle, err = s.beginQuery(op)
	if err != nil && legacy {
		s.dev.exitLegacy()
	}
	return ctx, handle, err
}

// beginQuery is begin without the legacy stream's capture check, for
// calls that only ask about captures and for BeginCapture and EndCapture;
// endQuery must follow.
func (s *Stream) beginQuery(op string) (ctx, handle uintptr, err error) {
	if s == nil || s.dev == nil {
		return 0, 0, errZeroStream(op)
	}
	if !s.guard.Enter() {
		return 0, 0, &OpError{Op: op, Err: ErrClosed}
	}
	ctx, err = s.dev.contextFor(op)
	if err != nil {
		s.guard.Leave()
		return 0, 0, err
	}
	return ctx, s.handle, nil
}

// endQuery ends a call begun with beginQuery.
func (s *Stream) endQuery() { s.guard.Leave() }

// end ends a call begun with begin.
func (s *Stream) end() {
	s.guard.Leave()
	if s.IsDefault() {
		s.dev.exitLegacy()
	}
}

// Sync waits until all work submitted to the stream has finished.
func (s *Stream) Sync() error {
	ctx, h, err := s.begin("Stream.Sync")
	if err != nil {
		return err
	}
	defer s.end()
	// Synchronizing would invalidate a capture.
	if err := s.refuseCaptureLocked("Stream.Sync"); err != nil {
		return err
	}
	return result(&s.dev.drv.StreamSynchronize, s.dev.drv.StreamSynchronize.CallCtx(ctx, h))
}

// Done reports whether all work submitted to the stream has finished,
// without waiting.
func (s *Stream) Done() (bool, error) {
	ctx, h, err := s.begin("Stream.Done")
	if err != nil {
		return false, err
	}
	defer s.end()
	if err := s.refuseCaptureLocked("Stream.Done"); err != nil {
		return false, err
	}
	r := s.dev.drv.StreamQuery.CallCtx(ctx, h)
	switch {
	case ok(r):
		return true, nil
	case Result(int32(r)) == ErrorNotReady:
		return false, nil
	}
	return false, fail(&s.dev.drv.StreamQuery, r)
}

// Close destroys an owned stream after work already submitted completes
// (cuStreamDestroy does not wait, but the driver finishes the work). It is
// idempotent; closing a default stream does nothing, and closing a
// borrowed one (WrapStream) only ends its use here: the stream itself
// belongs to whoever created it.
//
// Close of an owned stream that began a capture ends it and discards its
// graph. Close is refused, with an error matching ErrCapturing and
// nothing changed, while the stream is in a capture it joined by a wait,
// and, for a borrowed stream, while a capture begun through this value
// goes on (end it with EndCapture). A capture that ended unseen is asked
// about and no longer refuses.
//
// After Context.Close destroyed the stream's context, Close makes no
// driver call and marks the stream closed: nil for a context from
// NewContext, and for an owned stream of a green context (which CUDA
// leaks) an error matching ErrClosed, on this and every later Close.
//
// Calls on the stream made while Close runs wait for its outcome: they go
// ahead if Close fails, and are refused with ErrClosed if it succeeds.
func (s *Stream) Close() error {
	const op = "Stream.Close"
	if s == nil || s.dev == nil || !s.owned && !s.borrowed {
		return nil
	}
	if s.guard.lock() {
		s.guard.unlock(true)
		return s.diedErr
	}
	closed, err := s.closeLocked(op)
	s.guard.unlock(closed)
	s.settleClose() // deferred work due, with the guard unlocked
	return err
}

// closeLocked is Close with the guard locked: closed reports whether the
// stream is closed now.
func (s *Stream) closeLocked(op string) (closed bool, err error) {
	dead := s.dev.contextClosedDone()
	if err := s.closeCapture(op, dead); err != nil {
		return false, err
	}
	if dead {
		// Nothing of a destroyed context may reach the driver.
		if s.owned {
			s.diedErr = s.dev.diedWith(op, "stream", s.handle)
		}
		return true, s.diedErr
	}
	if s.borrowed { // nothing of ours to destroy
		return true, nil
	}
	ctx, err := s.dev.contextFor(op)
	if err != nil {
		return false, err
	}
	// The driver cannot destroy a capturing stream.
	if err := s.abandonCapture(ctx); err != nil {
		return false, err
	}
	if r := s.dev.drv.StreamDestroy.CallCtx(ctx, s.handle); !ok(r) {
		return false, fail(&s.dev.drv.StreamDestroy, r)
	}
	streamClosed(s)
	return true, nil
}
