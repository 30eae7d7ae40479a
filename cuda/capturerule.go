package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The capture rule.
//
// While a stream captures, the driver records what is enqueued on it as
// graph nodes, forbids what would make the host wait for it, and reacts
// to three more things an operation can do without naming the capturing
// stream at all:
//
//   - ordering one stream after another (an event recorded on one and
//     waited on by the other): waiting on an event recorded in a capture
//     pulls the waiting stream into that capture; a capturing stream
//     waiting on work outside its capture, or on another capture's work,
//     is illegal and invalidates the capture;
//   - waiting for the whole context (cuCtxSynchronize: Device.Sync, and
//     the quiescing before a pool is destroyed) while any of its streams
//     captures invalidates those captures;
//   - waiting for or querying an event recorded in a capture is illegal.
//
// Every operation in cudamem that touches a stream, an event or the whole
// context asks one of the functions below first, each deciding from the
// streams the operation touches (its own, the one it waits on, the one it
// frees on): RefuseCapture (work that cannot be a node, on one stream),
// RefuseOrder (one stream after another), Device.RefuseDeviceWait (the
// whole context), and Event's record-time bookkeeping. The answer is
// either nil (run it: outside a capture, or as a node of it) or an error
// matching ErrCapturing, given before anything is submitted, so the
// capture stays valid and nothing joins it by accident. Deferred
// destruction that needs the context quiet waits with
// Device.DeferWhileCapturing until no capture is in flight.

// captureSeq is one capture sequence that cudamem saw begin
// (Stream.BeginCapture): the origin stream and the streams that joined it
// through Stream.WaitEvent or Stream.WaitStream on its work.
type captureSeq struct {
	origin *Stream
	mu     sync.Mutex
	joined []*Stream // streams pulled in by a wait; they leave when it ends
	over   atomic.Bool
}

// finish ends the sequence: the joined streams stop capturing with it.
func (c *captureSeq) finish() {
	if c.over.Swap(true) {
		return
	}
	c.mu.Lock()
	joined := c.joined
	c.joined = nil
	c.mu.Unlock()
	for _, s := range joined {
		s.leave(c)
	}
}

// leave clears s's capture flag if s is in capture c as a joined stream.
func (s *Stream) leave(c *captureSeq) {
	if s.seq.CompareAndSwap(c, nil) {
		if s.capState.Swap(capNone) != capNone && s.blocking {
			s.dev.blockingCaptures.Add(-1)
		}
	}
}

// join records that s joined capture c (a wait on c's work succeeded).
func (s *Stream) join(c *captureSeq) {
	if c == nil || c.over.Load() || !s.seq.CompareAndSwap(nil, c) {
		return
	}
	if !s.capState.CompareAndSwap(capNone, capActive) {
		s.seq.CompareAndSwap(c, nil)
		return
	}
	if s.blocking {
		s.dev.blockingCaptures.Add(1)
	}
	c.mu.Lock()
	over := c.over.Load()
	if !over {
		c.joined = append(c.joined, s)
	}
	c.mu.Unlock()
	if over { // ended meanwhile: the driver's join ended with it
		s.leave(c)
	}
}

// joinCapture records that s joined the capture rec went into.
func (s *Stream) joinCapture(rec *eventCapture) {
	if rec.seq != nil {
		s.join(rec.seq)
		return
	}
	// A capture cudamem did not see begin: flag s so the driver is asked
	// from now on; the flag clears when the driver says it is over. Its
	// id tells Close and EndCapture that capture from a later one.
	if s.capState.CompareAndSwap(capNone, capActive) {
		s.joinedID.Store(rec.id)
		if s.blocking {
			s.dev.blockingCaptures.Add(1)
		}
	}
}

// capID is what the rule knows of a stream's capture: none, a capture
// cudamem saw begin (seq), or one the driver reports (id; borrowed
// streams whose capture foreign code began). legacy marks the legacy
// default stream while a blocking stream of its context captures: any
// work on it would join that capture.
type capID struct {
	capturing bool
	legacy    bool
	seq       *captureSeq
	id        uint64
}

func (a capID) same(b capID) bool {
	switch {
	case !a.capturing || !b.capturing:
		return a.capturing == b.capturing
	case a.seq != nil && b.seq != nil:
		return a.seq == b.seq
	case a.id != 0 && b.id != 0:
		return a.id == b.id
	}
	return false
}

// captureOf says which capture s is in. It costs atomic loads for
// cudamem's own streams that are not capturing, and a driver query for a
// stream whose flag says capturing (to confirm) or that is borrowed.
// Nil, zero and closed streams are not capturing: the operation's own
// checks report them.
func (s *Stream) captureOf(op string) (capID, error) {
	if c, ask := s.captureFast(); !ask {
		return c, nil
	}
	ctx, h, err := s.beginQuery(op)
	if err != nil {
		return capID{}, nil // closed meanwhile: the operation reports it
	}
	defer s.end()
	return s.captureAsk(op, ctx, h)
}

// captureOfLocked is captureOf for a caller inside begin/end (which must
// not take the read lock again: a waiting Close would deadlock it).
func (s *Stream) captureOfLocked(op string, ctx, h uintptr) (capID, error) {
	if c, ask := s.captureFast(); !ask {
		return c, nil
	}
	return s.captureAsk(op, ctx, h)
}

// captureFast answers from the flags; ask says the driver must be asked.
func (s *Stream) captureFast() (c capID, ask bool) {
	if s == nil || s.dev == nil || s.closed.Load() {
		return capID{}, false
	}
	switch st := s.capState.Load(); {
	case st == capBeginning:
		return capID{capturing: true, seq: s.seq.Load()}, false
	case st == capNone && s.IsDefault():
		if s.dev.blockingCaptures.Load() > 0 {
			return capID{capturing: true, legacy: true}, false
		}
		return capID{}, false
	case st == capNone && !s.borrowed:
		return capID{}, false
	}
	return capID{}, true
}

// captureAsk asks the driver which capture s is in (its id where the
// driver can say).
func (s *Stream) captureAsk(op string, ctx, h uintptr) (capID, error) {
	seen := s.seq.Load()
	var status int32
	var id uint64
	p := &s.dev.drv.StreamGetCaptureInfo
	if p.Found() {
		if r := p.CallCtx(ctx, h, uintptr(unsafe.Pointer(&status)), uintptr(unsafe.Pointer(&id)), 0, 0, 0, 0); !ok(r) {
			return capID{}, &OpError{Op: op, Err: fmt.Errorf("asking whether stream %#x of %v is capturing: %w", h, s.dev, fail(p, r))}
		}
	} else {
		st, err := s.status(ctx, h)
		if err != nil {
			return capID{}, &OpError{Op: op, Err: fmt.Errorf("asking whether stream %#x of %v is capturing: %w", h, s.dev, err)}
		}
		status = int32(st)
	}
	if CaptureStatus(status) == CaptureStatusNone {
		if s.capState.Load() == capActive {
			s.captureEndedIf(seen) // ended through another value of the handle
		}
		return capID{}, nil
	}
	return capID{capturing: true, seq: s.seq.Load(), id: id}, nil
}

// describe names a stream for the rule's messages.
func (s *Stream) describe() string {
	if s == nil || s.dev == nil {
		return "a nil or zero stream"
	}
	if s.IsDefault() {
		return fmt.Sprintf("the legacy default stream of %v", s.dev)
	}
	return fmt.Sprintf("stream %#x of %v", s.handle, s.dev)
}

// RefuseOrder returns nil if work on waiter may be ordered after the work
// submitted to waited so far (an event recorded on waited, then waited on
// by waiter) without harming a capture, and otherwise an error naming op
// and both streams that matches ErrCapturing. It allows the order when
// neither stream captures and when both are in the same capture (the
// event and the wait become nodes). It refuses it when only waited
// captures (waiter would be pulled into that capture, and the work
// cudamem submits to it next would be recorded instead of run), when only
// waiter captures (a capture cannot wait on work outside it), and when
// they are in different captures. Resources and buffers call it before
// ordering one stream after another on their own account (a free after
// other streams' work, reusing memory across streams). Nil, zero and
// closed streams are not checked here: the operation's own checks report
// them. Two streams that are not capturing cost two atomic loads.
func RefuseOrder(op string, waiter, waited *Stream) error {
	if waiter == waited {
		return nil
	}
	w, err := waiter.captureOf(op)
	if err != nil {
		return err
	}
	d, err := waited.captureOf(op)
	if err != nil {
		return err
	}
	_, err = decideOrder(op, waiter, w, waited.describe(), d, false)
	return err
}

// decideOrder is the rule for ordering waiter (in capture w) after work
// in capture d (described by what). With mayJoin (an explicit wait the
// caller asked for: Stream.WaitEvent and WaitStream), a waiter outside
// any capture may join d, which is how a capture forks into several
// streams; join reports that it will.
func decideOrder(op string, waiter *Stream, w capID, what string, d capID, mayJoin bool) (join bool, err error) {
	switch {
	case w.legacy || d.legacy:
		return false, Errorf(op, ErrCapturing, "ordering %v after %s: the legacy default stream would join the capture of a blocking stream (made without StreamNonBlocking) and invalidate it; use another stream until EndCapture", waiter.describe(), what)
	case !w.capturing && !d.capturing, w.same(d):
		return false, nil
	case !w.capturing && mayJoin:
		return true, nil
	case !w.capturing:
		return false, Errorf(op, ErrCapturing, "%v would be pulled into the capture that %s is in, and its later work recorded instead of run; do it after EndCapture", waiter.describe(), what)
	case !d.capturing:
		return false, Errorf(op, ErrCapturing, "%v is capturing, and a capture cannot wait on work outside it (%s); do it before BeginCapture or after EndCapture", waiter.describe(), what)
	}
	return false, Errorf(op, ErrCapturing, "%v and %s are in different captures, which cannot wait on each other", waiter.describe(), what)
}

// RefuseDeviceWait returns nil if the host may wait for all work of d's
// context (cuCtxSynchronize), and otherwise an error naming op that
// matches ErrCapturing: a stream of the context that cudamem saw begin a
// capture is capturing, and the wait would invalidate that capture.
// (Captures that foreign code began on streams cudamem never saw are not
// counted.)
func (d *Device) RefuseDeviceWait(op string) error {
	if !d.valid() {
		return nil
	}
	if n := d.captures.Load(); n > 0 {
		return Errorf(op, ErrCapturing, "%d stream(s) of %v are capturing, and waiting for the whole context would invalidate their captures; do it after EndCapture", n, d)
	}
	return nil
}

// DeferWhileCapturing arranges for fn to run, on a new goroutine, once no
// stream of d's context that cudamem saw begin a capture is capturing,
// and returns true; with no capture in flight it returns false and does
// nothing, so the caller goes ahead itself. It is how a destruction that
// must wait for the whole context first (a pool's) is put off rather than
// refused when it comes from a free that already succeeded. fn never runs
// on the caller's goroutine, so it may take the caller's locks.
func (d *Device) DeferWhileCapturing(fn func()) bool {
	if !d.valid() || fn == nil {
		return false
	}
	d.capMu.Lock()
	defer d.capMu.Unlock()
	if d.captures.Load() == 0 {
		return false
	}
	d.afterCapture = append(d.afterCapture, fn)
	return true
}

// Starting a capture, and the calls it must not overlap.
//
// The rule's checks read counts (captures, blockingCaptures) and then call
// the driver; a capture begun on another goroutine between the two would
// be invalidated by the call (a cuCtxSynchronize, or work on the legacy
// default stream joining a blocking stream's capture). So those calls
// register first (enterWait), check, call, and unregister (exitWait); and
// BeginCapture raises the counts first, then waits until no registered
// call is in flight (drainWaits), and only then begins. Either the call
// sees the raised count and refuses, or BeginCapture sees the call and
// waits for it: the atomic operations are sequentially consistent, so
// both cannot miss each other. BeginCapture waits holding no lock, so a
// call in flight never waits on it.

//
// Every capture waits for the waits for the whole context; only a
// blocking stream's capture waits for legacy-stream calls, the only ones
// it refuses: a capture of a non-blocking stream leaves the legacy stream
// free, and waiting for its calls would let a busy legacy stream hold the
// capture off indefinitely. A call that comes after the counts were
// raised is refused and unregisters at once (it does no driver work), so
// the count a capture waits for drains.

// Kinds of calls registered with enterWait.
const (
	waitContext = 0 // waits for the whole context (Device.Sync, Context.Close)
	waitLegacy  = 1 // calls on the legacy default stream
)

// enterWait registers a call of kind k that must not overlap the start of
// a capture; exitWait(k) must follow.
func (d *Device) enterWait(k int) { d.waits[k].Add(1) }

// exitWait ends a call registered by enterWait, waking a BeginCapture
// waiting for the last one of its kind.
func (d *Device) exitWait(k int) {
	if d.waits[k].Add(-1) == 0 && d.capWaiters.Load() > 0 {
		d.capMu.Lock()
		d.waitsDone.Broadcast()
		d.capMu.Unlock()
	}
}

// drainWaits waits until no call registered by enterWait is in flight: of
// the context-wide kind if context, of the legacy-stream kind if legacy.
// The caller has raised its counts, so no new such call gets past its
// check; it holds no lock that such a call may need.
func (d *Device) drainWaits(context, legacy bool) {
	busy := func() bool {
		return context && d.waits[waitContext].Load() > 0 || legacy && d.waits[waitLegacy].Load() > 0
	}
	if !busy() {
		return
	}
	d.capWaiters.Add(1)
	d.capMu.Lock()
	d.waitsDone.L = &d.capMu
	for busy() {
		d.waitsDone.Wait()
	}
	d.capMu.Unlock()
	d.capWaiters.Add(-1)
}

// captureBegun counts a capture of d's context.
func (d *Device) captureBegun() {
	d.capMu.Lock()
	d.captures.Add(1)
	d.capMu.Unlock()
}

// captureOver uncounts a capture of d's context, and runs what was
// deferred once none is left.
func (d *Device) captureOver() {
	d.capMu.Lock()
	var run []func()
	if d.captures.Add(-1) == 0 {
		run, d.afterCapture = d.afterCapture, nil
	}
	d.capMu.Unlock()
	for _, fn := range run {
		go fn()
	}
}

// eventCapture is what Event.Record saw of the stream it recorded on: the
// capture the record went into (nil: it ran). For a borrowed stream whose
// capture foreign code began, stream and id say which one.
type eventCapture struct {
	seq    *captureSeq
	stream *Stream
	id     uint64
}

// active reports whether the capture the event was recorded into is still
// in progress.
func (c *eventCapture) active(op string) bool {
	switch {
	case c == nil:
		return false
	case c.seq != nil:
		return !c.seq.over.Load()
	}
	now, err := c.stream.captureOf(op)
	return err != nil || now.capturing && (c.id == 0 || now.id == c.id)
}

// activeLocked is active for a caller holding stream s's read lock (ctx
// and h its context and handle): when the event was recorded on s itself,
// s is asked without taking the lock again (a waiting Close would
// deadlock a second read lock).
func (c *eventCapture) activeLocked(op string, s *Stream, ctx, h uintptr) bool {
	if c == nil || c.seq != nil || c.stream != s {
		return c.active(op)
	}
	now, err := s.captureOfLocked(op, ctx, h)
	return err != nil || now.capturing && (c.id == 0 || now.id == c.id)
}

func (c *eventCapture) capID() capID {
	if c == nil {
		return capID{}
	}
	return capID{capturing: true, seq: c.seq, id: c.id}
}

// recorded is what e's last record saw of a capture (nil: none, or a nil
// or zero event, which the caller's own checks report).
func (e *Event) recorded() *eventCapture {
	if e == nil {
		return nil
	}
	return e.rec.Load()
}

// refuseCaptured refuses a host wait or query on e while the capture it
// was last recorded into is in progress (the driver forbids it).
func (e *Event) refuseCaptured(op string) error {
	if c := e.rec.Load(); c != nil && c.active(op) {
		return Errorf(op, ErrCapturing, "the event of %v was recorded into a capture (on %v) that is still in progress: it marks a graph node, not work that runs, until EndCapture", e.dev, c.stream.describe())
	}
	return nil
}
