package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrCapturing means an operation was refused because its stream is
// capturing a graph (Stream.BeginCapture): it would not be recorded into
// the graph, or it would invalidate the capture. The capture is left
// valid. Allocate inside a capture with package resource's GraphMemory.
var ErrCapturing = errors.New("cuda: stream is capturing a graph")

// CaptureMode is a CUstreamCaptureMode: how strictly the driver forbids
// unsafe calls (cuMemAlloc, synchronous copies, ...) on other threads
// while a capture is in progress.
//
// The modes speak of OS threads, which goroutines move between:
// CaptureModeGlobal fails (and invalidates the capture on) an unsafe call
// on any thread, another goroutine's included, and both strict modes need
// EndCapture on the thread that began the capture. Hence the default,
// CaptureModeRelaxed, which forbids unsafe calls on the capturing stream
// only. Use the others only with the goroutine locked to its thread
// (runtime.LockOSThread) from BeginCapture to EndCapture, and no other
// goroutine calling the driver meanwhile.
type CaptureMode int32

// Capture modes, with the values of CUstreamCaptureMode.
const (
	CaptureModeGlobal      CaptureMode = 0
	CaptureModeThreadLocal CaptureMode = 1
	CaptureModeRelaxed     CaptureMode = 2
)

func (m CaptureMode) String() string {
	return enumName([]string{"global", "thread-local", "relaxed"}, 0, int(m), "CaptureMode")
}

// CaptureStatus is a CUstreamCaptureStatus.
type CaptureStatus int32

// Capture statuses, with the values of CUstreamCaptureStatus.
const (
	// CaptureStatusNone: the stream is not capturing.
	CaptureStatusNone CaptureStatus = 0
	// CaptureStatusActive: the stream is capturing.
	CaptureStatusActive CaptureStatus = 1
	// CaptureStatusInvalidated: the stream was capturing, but an error
	// invalidated the capture; EndCapture must still end it (and fails).
	CaptureStatusInvalidated CaptureStatus = 2
)

func (c CaptureStatus) String() string {
	return enumName([]string{"none", "active", "invalidated"}, 0, int(c), "CaptureStatus")
}

// BeginCapture starts capturing s in relaxed mode (see [CaptureMode]):
// until EndCapture, work submitted to s is recorded into a graph instead
// of run. The legacy default stream cannot be captured.
func (s *Stream) BeginCapture() error { return s.BeginCaptureMode(CaptureModeRelaxed) }

// BeginCaptureMode is BeginCapture with an explicit mode; read
// [CaptureMode] before choosing anything but CaptureModeRelaxed.
func (s *Stream) BeginCaptureMode(mode CaptureMode) error {
	const op = "Stream.BeginCapture"
	if mode < CaptureModeGlobal || mode > CaptureModeRelaxed {
		return Errorf(op, ErrInvalidArgument, "unknown capture mode %d (want CaptureModeGlobal, CaptureModeThreadLocal or CaptureModeRelaxed)", int32(mode))
	}
	if s == nil || s.dev == nil {
		_, _, err := s.beginQuery(op) // the zero stream's error
		return err
	}
	if s.IsDefault() {
		return Errorf(op, ErrInvalidArgument, "the legacy default stream of %v cannot be captured (capture a stream from Device.NewStream)", s.dev)
	}
	// Raise the counts first, then wait out the calls in flight that the
	// capture refuses (the gate, capturerule.go).
	d := s.dev
	defer d.gate.runDeferred()
	d.gate.raise(true, s.capture.blocking)
	unannounce := func() { d.gate.lower(true, s.capture.blocking) }
	ctx, h, err := s.beginQuery(op)
	if err != nil {
		unannounce()
		return err
	}
	defer s.endQuery()
	// Raise the flag before the driver call, so no allocation on another
	// goroutine slips between the capture starting and the flag.
	if !s.capture.state.CompareAndSwap(capNone, capBeginning) {
		unannounce()
		return Errorf(op, ErrCapturing, "stream %#x of %v is already capturing (end it with EndCapture first)", h, s.dev)
	}
	// From here captureEnded lowers the counts raised above.
	s.capture.seq.Store(&captureSeq{origin: s})
	p := &s.dev.drv.StreamBeginCapture
	if r := p.CallCtx(ctx, h, uintptr(mode)); !ok(r) {
		s.captureEnded()
		return &OpError{Op: op, Err: fmt.Errorf("stream %#x of %v, %v mode: %w", h, s.dev, mode, fail(p, r))}
	}
	s.capture.state.Store(capActive)
	return nil
}

// Capture states of a Stream (capState).
const (
	capNone      = 0
	capBeginning = 1 // BeginCapture's driver call in progress
	capActive    = 2
)

// captureEnded lowers the capture flag (and the device's count of
// capturing blocking streams) once the capture is over, and leaves its
// sequence.
func (s *Stream) captureEnded() {
	if s.capture.state.Swap(capNone) == capNone {
		return
	}
	c := s.capture.seq.Swap(nil)
	s.dev.gate.lower(false, s.capture.blocking)
	s.leaveSeq(c)
}

// leaveSeq ends s's part in capture c: the sequence itself if s began it
// (the streams that joined stop capturing), and the capture's count in
// s's context if s began it or joined it from another context.
func (s *Stream) leaveSeq(c *captureSeq) {
	switch {
	case c != nil && c.origin == s:
		c.finish()
		s.dev.gate.lower(true, false)
	case s.crossContext(c):
		s.dev.gate.lower(true, false)
	}
}

// captureEndedIf is captureEnded for a caller that saw the capture end
// without ending it (the driver said none): it clears the flags only if
// they still describe the capture it saw (seen), so a capture that
// another goroutine ended and began again meanwhile keeps its flags.
func (s *Stream) captureEndedIf(seen *captureSeq) {
	if seen == nil {
		// A capture cudamem did not see begin (a borrowed stream's, or
		// one it joined through such a stream): only the flag to clear.
		if s.capture.state.CompareAndSwap(capActive, capNone) {
			if s.capture.seq.Load() != nil { // a capture began meanwhile: restore
				if !s.capture.state.CompareAndSwap(capNone, capActive) {
					// The other side set the flag and counted itself:
					// this flag's count goes.
					s.dev.gate.lower(false, s.capture.blocking)
				}
				return
			}
			s.dev.gate.lower(false, s.capture.blocking)
		}
		return
	}
	if !s.capture.seq.CompareAndSwap(seen, nil) {
		return
	}
	if s.capture.state.Swap(capNone) != capNone {
		s.dev.gate.lower(false, s.capture.blocking)
	}
	// Found over, not ended here: the work it leaves due runs on a
	// goroutine of its own (lower).
	s.leaveSeq(seen)
}

// joinedTo returns the stream whose capture s joined (nil if s began its
// capture, or is not capturing).
func (s *Stream) joinedTo() *Stream {
	if c := s.capture.seq.Load(); c != nil && c.origin != s {
		return c.origin
	}
	return nil
}

// EndCapture ends the capture begun with BeginCapture and returns the
// captured graph, which the caller must Close. On a stream not capturing
// it fails with ErrInvalidArgument (a borrowed stream's driver is asked);
// if the driver invalidated the capture it fails with
// ErrorStreamCaptureInvalidated, the capture is over and any partial
// graph destroyed. A stream that joined a capture by a wait cannot end
// it: that is refused before the driver with an error matching both
// ErrCapturing and ErrInvalidArgument (end it on the origin stream).
func (s *Stream) EndCapture() (*Graph, error) {
	g, seq, err := s.endCaptureCall()
	// Deferred work runs with the stream's lock let go, before returning.
	seq.settle()
	if s != nil && s.dev != nil {
		s.dev.gate.runDeferred()
	}
	return g, err
}

// endCaptureCall is EndCapture but for the deferred work; seq is the
// capture it may have ended (nil if none).
func (s *Stream) endCaptureCall() (_ *Graph, seq *captureSeq, _ error) {
	const op = "Stream.EndCapture"
	ctx, h, err := s.beginQuery(op)
	if err != nil {
		return nil, nil, err
	}
	defer s.endQuery()
	if s.capture.state.Load() == capNone && !s.borrowed {
		return nil, nil, Errorf(op, ErrInvalidArgument, "stream %#x of %v is not capturing (begin with BeginCapture)", h, s.dev)
	}
	if o := s.joinedTo(); o != nil {
		return nil, nil, s.errJoined(op, true, o.describe())
	}
	if s.capture.state.Load() != capNone && s.capture.seq.Load() == nil {
		// Joined a capture cudamem did not see begin: ending it here
		// would invalidate it, unless the driver says it is over.
		if err := s.refuseOpenCapture(op, true); err != nil {
			return nil, nil, err
		}
		if !s.borrowed {
			return nil, nil, Errorf(op, ErrInvalidArgument, "stream %#x of %v is not capturing: the capture it joined is over", h, s.dev)
		}
	}
	seq = s.capture.seq.Load()
	if seq != nil && seq.origin != s {
		seq = nil
	}
	g, err := s.endCapture(ctx, h)
	if err != nil {
		return nil, seq, &OpError{Op: op, Err: fmt.Errorf("stream %#x of %v: %w", h, s.dev, err)}
	}
	return g, seq, nil
}

// errJoined refuses Close or EndCapture (op; end for EndCapture) of s,
// which joined by a wait the capture that origin (in words) began.
// EndCapture's refusal also matches ErrInvalidArgument.
func (s *Stream) errJoined(op string, end bool, origin string) error {
	why := fmt.Sprintf("%v joined the capture that %s began (by waiting on its work), and only the stream that began a capture can end it; ending it here would invalidate it: make that stream wait for this one, then end the capture there", s.describe(), origin)
	if end {
		return &OpError{Op: op, Err: fmt.Errorf("%w (%w): %s", ErrCapturing, ErrInvalidArgument, why)}
	}
	return Errorf(op, ErrCapturing, "%s", why)
}

// refuseOpenCapture is for Close and EndCapture (op; end for EndCapture)
// of a stream whose flag records a capture they must not end (one joined
// that cudamem did not see begin, or a borrowed stream's). The flag may
// be stale, so the driver is asked: ErrCapturing while the capture goes
// on, nil (flags cleared) once it is over, and a failed query as is,
// since guessing could invalidate a capture or keep a flag for good.
// The caller holds s's lock.
func (s *Stream) refuseOpenCapture(op string, end bool) error {
	ctx, err := s.dev.contextFor(op)
	if err != nil {
		return err
	}
	seen := s.capture.seq.Load()
	c, err := s.captureAsk(op, ctx, s.handle)
	if err != nil {
		return err
	}
	if c.capturing && seen == nil {
		if j := s.capture.joinedID.Load(); j != 0 && c.id != 0 && c.id != j {
			// The capture s joined is over and another began on the
			// handle since (not by a wait of s): the join flag is stale.
			s.captureEndedIf(nil)
			return nil
		}
	}
	switch {
	case !c.capturing:
		return nil // captureAsk cleared the flags
	case seen == nil:
		return s.errJoined(op, end, "other code")
	}
	return Errorf(op, ErrCapturing, "borrowed %v is capturing a graph begun through this value (BeginCapture); Close of a borrowed stream does not end its capture (the stream is its owner's), and the capture must stay counted until it ends: end it with EndCapture first", s.describe())
}

// endCapture calls cuStreamEndCapture and settles the flag: cleared when
// the capture is over, kept when it goes on (a wrong-thread failure in a
// strict mode), as cuStreamIsCapturing says after a failure. A graph
// returned together with an error is destroyed.
func (s *Stream) endCapture(ctx, h uintptr) (*Graph, error) {
	drv := s.dev.drv
	var gh uintptr
	r := drv.StreamEndCapture.CallCtx(ctx, h, uintptr(unsafe.Pointer(&gh)))
	if ok(r) {
		s.captureEnded()
		if gh == 0 {
			// Success with no graph should not happen; say so rather
			// than hand out a Graph that cannot be used.
			return nil, fmt.Errorf("%w: cuStreamEndCapture returned no graph", ErrorStreamCaptureInvalidated)
		}
		return newGraph(s.dev, ctx, gh), nil
	}
	err := fail(&drv.StreamEndCapture, r)
	if gh != 0 {
		if dr := drv.GraphDestroy.CallCtx(ctx, gh); !ok(dr) {
			err = errors.Join(err, fmt.Errorf("destroying the partial graph: %w", fail(&drv.GraphDestroy, dr)))
		}
	}
	switch st, qerr := s.status(ctx, h); {
	case qerr != nil:
		// Keep the flag: refusing work is safer than letting it
		// invalidate a capture still in progress.
	case st == CaptureStatusNone:
		s.captureEnded()
	}
	if Result(int32(r)) == ErrorStreamCaptureInvalidated {
		err = fmt.Errorf("the capture was invalidated by an operation that cannot be captured (a synchronization, a non-stream-ordered allocation, or work on the legacy stream); nothing was kept: %w", err)
	}
	return nil, err
}

// closeCapture is the capture rule's part of Close (dead: the context was
// destroyed), before anything is destroyed: it refuses a Close that would
// end a capture it must not (see Stream.Close), and it notes the capture
// the stream began, whose deferred work settleClose runs. The caller holds
// the guard's Lock.
func (s *Stream) closeCapture(op string, dead bool) error {
	if c := s.capture.seq.Load(); c != nil && c.origin == s {
		s.capture.closed.Store(c)
	}
	if dead {
		// Any capture of the context ended with it.
		if s.capture.state.Load() != capNone {
			s.captureEnded()
		}
		return nil
	}
	if o := s.joinedTo(); o != nil {
		// The driver cannot destroy a stream in the middle of a capture,
		// and only the stream that began it can end it.
		return s.errJoined(op, false, o.describe())
	}
	if s.capture.state.Load() != capNone && (s.borrowed || s.capture.seq.Load() == nil) {
		// A capture this Close must not end, unless the driver says it
		// is over.
		return s.refuseOpenCapture(op, false)
	}
	return nil
}

// settleClose runs, once Close has unlocked the stream, the work deferred
// until the capture it ended (if any) is over.
func (s *Stream) settleClose() {
	s.capture.closed.Swap(nil).settle()
	s.dev.gate.runDeferred()
}

// abandonCapture ends an open capture before the stream is destroyed,
// discarding its graph, or retries destroying the graph of one an earlier
// Close ended. The caller holds the guard's Lock.
func (s *Stream) abandonCapture(ctx uintptr) error {
	if s.capture.state.Load() == capNone {
		return s.closeAbandoned()
	}
	g, err := s.endCapture(ctx, s.handle)
	if err != nil && s.capture.state.Load() != capNone {
		return &OpError{Op: "Stream.Close", Err: fmt.Errorf("ending the open capture: %w", err)}
	}
	// The capture is over (an invalidated capture ends with an error):
	// the stream can be destroyed once its graph is.
	if g != nil {
		s.capture.abandoned = g
	}
	return s.closeAbandoned()
}

// closeAbandoned destroys the graph of a capture Close ended; one that
// fails to go is kept for the next Close to retry (the stream stays open
// meanwhile, so the failure is reported, not leaked).
func (s *Stream) closeAbandoned() error {
	if s.capture.abandoned == nil {
		return nil
	}
	if err := s.capture.abandoned.Close(); err != nil {
		return &OpError{Op: "Stream.Close", Err: fmt.Errorf("destroying the graph of the capture it ended: %w", err)}
	}
	s.capture.abandoned = nil
	return nil
}

// status asks the driver (cuStreamIsCapturing).
func (s *Stream) status(ctx, h uintptr) (CaptureStatus, error) {
	var st int32
	p := &s.dev.drv.StreamIsCapturing
	if r := p.CallCtx(ctx, h, uintptr(unsafe.Pointer(&st))); !ok(r) {
		return 0, fail(p, r)
	}
	return CaptureStatus(st), nil
}

// CaptureStatus asks the driver whether s is capturing
// (cuStreamIsCapturing). On the legacy default stream while a blocking
// stream captures, the driver answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
// (ErrorStreamCaptureImplicit), without harming the capture.
func (s *Stream) CaptureStatus() (CaptureStatus, error) {
	const op = "Stream.CaptureStatus"
	ctx, h, err := s.beginQuery(op)
	if err != nil {
		return 0, err
	}
	defer s.endQuery()
	st, err := s.status(ctx, h)
	if err != nil {
		return 0, &OpError{Op: op, Err: err}
	}
	return st, nil
}

// CaptureID returns the capture's status and the unique id the driver
// gives each capture sequence (cuStreamGetCaptureInfo; the id is 0 when
// not capturing). It needs a CUDA 12.3 or later driver.
func (s *Stream) CaptureID() (CaptureStatus, uint64, error) {
	const op = "Stream.CaptureID"
	ctx, h, err := s.beginQuery(op)
	if err != nil {
		return 0, 0, err
	}
	defer s.endQuery()
	var st int32
	var id uint64
	p := &s.dev.drv.StreamGetCaptureInfo
	if r := p.CallCtx(ctx, h, uintptr(unsafe.Pointer(&st)), uintptr(unsafe.Pointer(&id)), 0, 0, 0, 0); !ok(r) {
		return 0, 0, &OpError{Op: op, Err: fail(p, r)}
	}
	if CaptureStatus(st) == CaptureStatusNone {
		id = 0
	}
	return CaptureStatus(st), id, nil
}

// IsCapturing reports whether s is capturing. An owned stream not
// capturing costs one atomic load; one whose flag says capturing, and
// every borrowed stream, is confirmed with the driver. The legacy default
// stream reports true while a blocking stream of its device captures.
// Nil, zero and closed streams report false.
func (s *Stream) IsCapturing() bool { return s.RefuseCapture("Stream.IsCapturing") != nil }

// RefuseCapture returns nil if work that cannot be captured may be
// submitted to s, and otherwise an error naming op and matching
// ErrCapturing: s is capturing, or s is the legacy default stream while a
// blocking stream of its device captures. Resources and copy paths call
// it first, so a refused operation leaves the capture valid. A nil, zero
// or closed stream returns nil (the operation's own checks report it).
// A borrowed stream's driver is asked, and a failed query returned. A
// capture begun on an owned stream's raw handle by other code is not
// seen: wrap the handle with WrapStream to have the driver asked.
func (s *Stream) RefuseCapture(op string) error {
	if s == nil || s.dev == nil || s.guard.IsClosed() {
		return nil
	}
	if err, ask := s.refuseFast(op); !ask {
		return err
	}
	ctx, h, err := s.beginQuery(op)
	if err != nil {
		return nil // closed meanwhile: the operation reports it
	}
	defer s.endQuery()
	return s.refuseAsk(op, ctx, h)
}

// refuseFast decides what it can without the driver: ask reports that
// the driver must be asked (refuseAsk) because the flag says capturing
// (to confirm it) or the stream is borrowed.
func (s *Stream) refuseFast(op string) (err error, ask bool) {
	switch st := s.capture.state.Load(); {
	case st == capBeginning:
		return s.errCapturing(op), false
	case st == capActive:
		// Confirm: another Stream value of the handle may have ended it.
		return nil, true
	case s.IsDefault():
		if s.dev.gate.blocking.Load() > 0 {
			return s.dev.errLegacyCapture(op), false
		}
		return nil, false
	}
	return nil, s.borrowed
}

// refuseAsk is the driver-asking half of RefuseCapture, for a caller
// inside begin/end.
func (s *Stream) refuseAsk(op string, ctx, h uintptr) error {
	if s.capture.state.Load() == capActive {
		return s.confirmCapture(op, ctx, h)
	}
	return s.refuseBorrowed(op, ctx, h)
}

func (s *Stream) errCapturing(op string) error {
	return Errorf(op, ErrCapturing, "stream %#x of %v is capturing a graph, and this operation cannot be captured (allocate with resource.GraphMemory inside a capture, or do it after EndCapture)", s.handle, s.dev)
}

// confirmCapture asks the driver about a stream whose flag says it is
// capturing: still capturing (or the query failed) refuses; ended
// elsewhere clears the flag.
func (s *Stream) confirmCapture(op string, ctx, h uintptr) error {
	seen := s.capture.seq.Load()
	st, err := s.status(ctx, h)
	if err == nil && st == CaptureStatusNone {
		s.captureEndedIf(seen)
		return nil
	}
	return s.errCapturing(op)
}

// refuseCaptureLocked is RefuseCapture for a caller inside begin/end
// (which must not enter the guard again: a waiting Close would
// deadlock it).
func (s *Stream) refuseCaptureLocked(op string) error {
	if err, ask := s.refuseFast(op); !ask {
		return err
	}
	ctx, err := s.dev.contextFor(op)
	if err != nil {
		return err
	}
	return s.refuseAsk(op, ctx, s.handle)
}

func (s *Stream) refuseBorrowed(op string, ctx, h uintptr) error {
	st, err := s.status(ctx, h)
	if err != nil {
		return &OpError{Op: op, Err: fmt.Errorf("asking whether borrowed stream %#x of %v is capturing: %w", h, s.dev, err)}
	}
	if st != CaptureStatusNone {
		return Errorf(op, ErrCapturing, "borrowed stream %#x of %v is capturing a graph (status %v), and this operation cannot be captured (allocate with resource.GraphMemory inside a capture, or do it after EndCapture)", h, s.dev, st)
	}
	return nil
}

// WaitEvent makes future work on s wait until e has completed.
//
// Under capture it follows RefuseOrder's rules, except that waiting on an
// event recorded into a capture pulls s into it (how a capture forks; s
// must be joined back into the capturing stream before EndCapture) until
// the capture ends. A wait RefuseOrder would refuse, or of the legacy
// default stream on an event recorded into any capture, is refused with
// an error matching ErrCapturing. A stream of another context that joins
// a capture counts as capturing in its own context too.
func (s *Stream) WaitEvent(e *Event) error {
	const op = "Stream.WaitEvent"
	// Joining starts capturing at the driver call, so, as BeginCapture
	// does, raise the counts that refuse legacy-stream work (s blocking)
	// and whole-context waits (s of another context) and wait out those
	// in flight, holding no lock; lowered on return, after join raised
	// its own. A record racing this wait may still escape it.
	if s != nil && s.dev != nil && !s.IsDefault() {
		if rec := e.recorded(); rec != nil && rec.active(op) {
			if cross := s.crossContext(rec.seq); s.capture.blocking || cross {
				g := &s.dev.gate
				defer g.runDeferred()
				g.raise(cross, s.capture.blocking)
				defer g.lower(cross, s.capture.blocking)
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
	// A nil or zero stream has no device to make the event on.
	if _, _, err := s.begin(op); err != nil {
		return err
	}
	s.end()
	if _, _, err := other.begin(op); err != nil {
		return err
	}
	dev := other.dev
	other.end()
	// Refuse what WaitEvent would before making the event.
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

// refuseContextWait enters the gate for a wait for the whole context of
// d (cuCtxSynchronize) named op; a nil error means the caller must call
// exitContextWait after its driver call.

func (d *Device) refuseContextWait(op string) error {
	if !d.gate.enter(callContext) {
		return d.errContextWait(op)
	}
	return nil
}

// exitContextWait ends a wait refuseContextWait let through.
func (d *Device) exitContextWait() { d.gate.leave(callContext) }
