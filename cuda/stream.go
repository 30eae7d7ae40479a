package cuda

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Stream is a CUDA stream of one device's primary context. Work submitted
// to a stream runs in order; different streams may overlap.
//
// A Stream from Device.NewStream is owned: Close destroys it, and any use
// after Close returns an error matching ErrClosed. Device.DefaultStream is
// the legacy default stream (handle 0): it is never destroyed. cudamem never
// uses the per-thread default stream, because goroutines are not threads.
//
// A Stream from Device.WrapStream is borrowed: a stream another library
// created (PyTorch's current stream, a cuBLAS handle's stream). Its Close
// only stops its use here; the stream is never destroyed by cudamem.
//
// Methods are safe for concurrent use, but closing a stream while other
// goroutines still submit work to it is a program error (as in CUDA).
type Stream struct {
	dev      *Device
	handle   uintptr
	owned    bool
	borrowed bool // from WrapStream: never destroyed here

	mu     sync.RWMutex
	closed atomic.Bool // written under mu; read anywhere

	waiter waiter // the blocking wait SyncContext callers share

	// capState is capBeginning from just before BeginCapture's driver
	// call, capActive once it succeeded, and capNone once the capture has
	// ended (see capture.go), so resources can refuse the stream with one
	// atomic load instead of a driver query. blocking
	// records that the stream synchronizes with the legacy default stream
	// (created without StreamNonBlocking): while it captures, work on the
	// legacy stream would join the capture and invalidate it.
	capState atomic.Int32
	blocking bool
	// seq is the capture the stream is in while capState is not capNone:
	// one it began, or one it joined by waiting on its work (nil for a
	// capture cudamem did not see begin).
	seq atomic.Pointer[captureSeq]
	// joinedID is the driver's id of the capture cudamem did not see
	// begin that s joined by a wait (joinCapture; 0 when the driver could
	// not say), so that Close and EndCapture can tell that capture from a
	// later one on the same handle.
	joinedID atomic.Uint64
	// abandoned is the graph of a capture Close ended but could not
	// destroy; the next Close retries (written under mu's write lock).
	abandoned *Graph
	// diedErr is what Close reports, each time, for an owned stream
	// closed after Context.Close destroyed its green context
	// (Device.diedWith). Written under mu's write lock.
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
	s := &Stream{dev: d, owned: true, blocking: flags&StreamNonBlocking == 0}
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
	if s == nil || s.closed.Load() {
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
	case s.closed.Load():
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
func (s *Stream) IsClosed() bool { return s == nil || s.closed.Load() }

// begin returns the context and handle for a call on s, holding a read
// lock that end releases, so Close cannot destroy the stream mid-call.
// On the legacy default stream while a blocking stream of its context
// captures (or is about to), it refuses with ErrCapturing: any work there
// would join that capture and invalidate it. A call on the legacy stream
// it lets through is a call in flight that a blocking stream's capture
// waits for before it begins, until end (the gate, capturerule.go).
func (s *Stream) begin(op string) (ctx, handle uintptr, err error) {
	if s == nil || s.dev == nil {
		return 0, 0, errZeroStream(op)
	}
	legacy := s.IsDefault()
	if legacy && !s.dev.gate.enter(callLegacy) {
		return 0, 0, s.dev.errLegacyCapture(op)
	}
	ctx, handle, err = s.beginQuery(op)
	if err != nil && legacy {
		s.dev.gate.leave(callLegacy)
	}
	return ctx, handle, err
}

// beginQuery is begin without the legacy stream's capture check, for the
// calls that only ask about captures (which the driver answers without
// harming one) and for BeginCapture and EndCapture, which are never work
// on the legacy stream; endQuery must follow.
func (s *Stream) beginQuery(op string) (ctx, handle uintptr, err error) {
	if s == nil || s.dev == nil {
		return 0, 0, errZeroStream(op)
	}
	s.mu.RLock()
	if s.closed.Load() {
		s.mu.RUnlock()
		return 0, 0, &OpError{Op: op, Err: ErrClosed}
	}
	ctx, err = s.dev.contextFor(op)
	if err != nil {
		s.mu.RUnlock()
		return 0, 0, err
	}
	return ctx, s.handle, nil
}

// endQuery ends a call begun with beginQuery.
func (s *Stream) endQuery() { s.mu.RUnlock() }

// end ends a call begun with begin.
func (s *Stream) end() {
	s.mu.RUnlock()
	if s.IsDefault() {
		s.dev.gate.leave(callLegacy)
	}
}

// Sync waits until all work submitted to the stream has finished.
func (s *Stream) Sync() error {
	ctx, h, err := s.begin("Stream.Sync")
	if err != nil {
		return err
	}
	defer s.end()
	// Synchronizing a capturing stream is illegal and would invalidate
	// the capture: refuse it here instead.
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

// WaitEvent makes future work on s wait until e has completed.
//
// Under capture it follows the driver's rules (see RefuseOrder): waiting
// on an event recorded into a capture pulls s into that capture (how a
// capture forks into several streams; s must then be joined back into
// the capturing stream, through an event recorded on s and waited on
// there, before EndCapture), and s stops capturing when the capture
// ends. A capturing s waiting on an event recorded outside its capture,
// or into another capture, is refused with an error matching
// ErrCapturing, as is any wait involving the legacy default stream while
// a blocking stream captures, and a wait of the legacy default stream on
// an event recorded into any capture (it cannot join one: the driver
// would invalidate the capture); the captures stay valid. A stream of
// another context that joins a capture counts as capturing in its own
// context too: Device.Sync there is refused until the capture ends.
func (s *Stream) WaitEvent(e *Event) error {
	const op = "Stream.WaitEvent"
	// A stream that joins a capture starts capturing at the driver call:
	// from then on, legacy-stream work would join the capture too if s is
	// blocking, and a wait for s's whole context would invalidate it if s
	// is of another context than the capture's origin. As BeginCapture
	// does, raise the counts that refuse such calls and wait out those in
	// flight first, holding no lock (the gate, capturerule.go). They are
	// lowered on return, after the join's own were raised (join), and the
	// work deferred meanwhile then runs. Decided from the event's capture
	// as it is now; a record racing this wait may still escape it.
	if s != nil && s.dev != nil && !s.IsDefault() {
		if rec := e.recorded(); rec != nil && rec.active(op) {
			if cross := s.crossContext(rec.seq); s.blocking || cross {
				g := &s.dev.gate
				defer g.runDeferred()
				g.raise(cross, s.blocking)
				defer g.lower(cross, s.blocking)
			}
		}
	}
	ctx, h, err := s.begin(op)
	if err != nil {
		return err
	}
	defer s.end()
	eh, err := e.get(op)
	if err != nil {
		return err
	}
	defer e.end()
	if err := e.dev.contextClosed(op); err != nil { // the event went with its context
		return err
	}
	w, err := s.captureOfLocked(op, ctx, h)
	if err != nil {
		return err
	}
	rec := e.rec.Load()
	if !rec.activeLocked(op, s, ctx, h) {
		rec = nil
	}
	what := "an event recorded outside any capture"
	if rec != nil {
		what = fmt.Sprintf("an event recorded into the capture on %v", rec.stream.describe())
	}
	join, err := decideOrder(op, s, w, what, rec.capID(), true)
	if err != nil {
		return err
	}
	if err := result(&s.dev.drv.StreamWaitEvent, s.dev.drv.StreamWaitEvent.CallCtx(ctx, h, eh, 0)); err != nil {
		return err
	}
	if join {
		s.joinCapture(rec)
	}
	return nil
}

// WaitStream makes future work on s wait for all work submitted to other
// so far (through a temporary event). Under capture it follows
// WaitEvent's rules; a wait WaitEvent would refuse is refused before the
// event is made.
func (s *Stream) WaitStream(other *Stream) error {
	const op = "Stream.WaitStream"
	// Check both streams before creating anything: a nil or zero stream
	// has no device to make the event on.
	if _, _, err := s.begin(op); err != nil {
		return err
	}
	s.end()
	if _, _, err := other.begin(op); err != nil {
		return err
	}
	dev := other.dev
	other.end()
	// Refused before anything is recorded where WaitEvent would refuse
	// the wait (the legacy stream joining a capture, a capture waiting on
	// work outside it): the temporary event is not made for nothing.
	w, err := s.captureOf(op)
	if err != nil {
		return err
	}
	o, err := other.captureOf(op)
	if err != nil {
		return err
	}
	if _, err := decideOrder(op, s, w, other.describe(), o, true); err != nil {
		return err
	}
	e, err := dev.NewEvent(EventDisableTiming)
	if err != nil {
		return err
	}
	err = e.Record(other)
	if err == nil {
		err = s.WaitEvent(e)
	}
	// The event may be destroyed at once: the driver keeps the wait alive.
	if cerr := e.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("%s: destroying the temporary event: %w", op, cerr))
	}
	return err
}

// Close destroys an owned stream after work already submitted completes
// (cuStreamDestroy does not wait, but the driver finishes the work). It is
// idempotent; closing a default stream does nothing, and closing a
// borrowed one (WrapStream) only ends its use here: the stream itself
// belongs to whoever created it.
//
// Captures: Close of an owned stream that began a capture ends it and
// discards its graph (the driver cannot destroy a capturing stream).
// Close never ends a capture it must not: it is refused, with an error
// matching ErrCapturing and nothing changed, while the stream is in a
// capture it joined by a wait (only the stream that began a capture can
// end it; ending it elsewhere invalidates it), whoever began that
// capture, and, for a borrowed stream, while a capture begun through
// this value goes on (the stream is its owner's, and its capture stays
// counted, refusing device-wide waits that would invalidate it, until
// EndCapture). A capture that ended without cudamem seeing it (foreign
// code ended it, or another value of the same handle) is asked about
// and no longer refuses.
//
// After Context.Close destroyed the stream's context, Close makes no
// driver call and marks the stream closed: it returns nil for a context
// from NewContext (the stream died with it), and for an owned stream of a
// green context, which CUDA leaks, an error matching ErrClosed that says
// so, on this and every later Close.
func (s *Stream) Close() error {
	const op = "Stream.Close"
	if s == nil || s.dev == nil || !s.owned && !s.borrowed {
		return nil
	}
	// A capture this Close ends may leave deferred work due: it runs
	// before Close returns, after the lock is let go (as for EndCapture).
	var ended *captureSeq
	defer func() {
		ended.settle()
		s.dev.gate.runDeferred()
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return s.diedErr
	}
	if c := s.seq.Load(); c != nil && c.origin == s {
		ended = c
	}
	if s.dev.contextClosedDone() {
		// Nothing of a destroyed context may reach the driver; any
		// capture of the context ended with it.
		if s.capState.Load() != capNone {
			s.captureEnded()
		}
		if s.owned {
			s.diedErr = s.dev.diedWith(op, "stream", s.handle)
		}
		s.closed.Store(true)
		return s.diedErr
	}
	if o := s.joinedTo(); o != nil {
		// The driver cannot destroy a stream in the middle of a capture,
		// and only the stream that began it can end it.
		return s.errJoined(op, false, o.describe())
	}
	if s.capState.Load() != capNone && (s.borrowed || s.seq.Load() == nil) {
		// A capture this Close must not end (see above), unless the
		// driver says it is over.
		if err := s.refuseOpenCapture(op, false); err != nil {
			return err
		}
	}
	if s.borrowed { // nothing of ours to destroy
		s.closed.Store(true)
		return nil
	}
	ctx, err := s.dev.contextFor(op)
	if err != nil {
		return err
	}
	// A capture still open is ended and its graph discarded first: the
	// driver cannot destroy a stream in the middle of a capture sequence.
	if s.capState.Load() != capNone {
		if err := s.abandonCapture(ctx); err != nil {
			return err
		}
	} else if err := s.closeAbandoned(); err != nil {
		return err
	}
	if r := s.dev.drv.StreamDestroy.CallCtx(ctx, s.handle); !ok(r) {
		return fail(&s.dev.drv.StreamDestroy, r)
	}
	streamClosed(s)
	s.closed.Store(true)
	return nil
}
