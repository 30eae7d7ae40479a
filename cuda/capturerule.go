package cuda

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The capture rule. Besides work that makes the host wait, a capture is
// invalidated by ordering streams across it (a capturing stream waiting
// on work outside its capture; a wait on a captured event pulls the
// waiter in), by a wait for its whole context (cuCtxSynchronize), and by
// waiting for or querying a captured event. Every operation asks first,
// from the streams it touches: RefuseCapture, RefuseOrder,
// Device.RefuseDeviceWait, Event's record-time bookkeeping. The answer is
// nil or an error matching ErrCapturing before anything is submitted, so
// the capture stays valid. Destruction that needs the context quiet waits
// with Device.DeferWhileCapturing.

// streamCapture is a stream's part in the capture rule.
type streamCapture struct {
	// state is capBeginning from just before BeginCapture's driver call,
	// capActive once it succeeded (or the stream joined a capture), and
	// capNone once the capture has ended: one atomic load for resources.
	state atomic.Int32
	// blocking: made without StreamNonBlocking, so while it captures, work
	// on the legacy stream would join the capture and invalidate it.
	blocking bool
	// seq is the capture the stream began or joined while state is not
	// capNone (nil for a capture cudamem did not see begin).
	seq atomic.Pointer[captureSeq]
	// joinedID is the driver's id (0 if unknown) of the unseen capture the
	// stream joined by a wait, to tell it from a later one on the handle.
	joinedID atomic.Uint64
	// abandoned is the graph of a capture Close ended but could not
	// destroy; the next Close retries (written under the guard's Lock).
	abandoned *Graph
	// closed is the capture a Close ended, whose deferred work runs once
	// that Close has unlocked the stream (settleClose).
	closed atomic.Pointer[captureSeq]
}

// captureSeq is one capture sequence that cudamem saw begin
// (Stream.BeginCapture): the origin stream and the streams that joined it
// through Stream.WaitEvent or Stream.WaitStream on its work.
type captureSeq struct {
	origin *Stream
	mu     sync.Mutex
	joined []*Stream // streams pulled in by a wait; they leave when it ends
	// gates are those of the other contexts whose streams joined: the
	// capture counts there too while they are in it.
	gates []*captureGate
	over  atomic.Bool
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

// settle runs the work deferred on the gates of every context the ended
// capture involved, once no capture is left there (gate.runDeferred).
// The caller holds no lock of this package.
func (c *captureSeq) settle() {
	if c == nil {
		return
	}
	c.origin.dev.gate.runDeferred()
	c.mu.Lock()
	gates := c.gates
	c.mu.Unlock()
	for _, g := range gates {
		g.runDeferred()
	}
}

// crossContext reports whether s, joining capture c, is of another
// context than the capture's origin: the capture then counts in s's
// context too (a wait for that whole context would invalidate it).
func (s *Stream) crossContext(c *captureSeq) bool {
	return c != nil && c.origin.dev != s.dev
}

// leave clears s's capture flag if s is in capture c as a joined stream.
func (s *Stream) leave(c *captureSeq) {
	if s.capture.seq.CompareAndSwap(c, nil) {
		if s.capture.state.Swap(capNone) != capNone {
			s.dev.gate.lower(s.crossContext(c), s.capture.blocking)
		}
	}
}

// join records that s joined capture c (a wait on c's work succeeded).
func (s *Stream) join(c *captureSeq) {
	if c == nil || c.over.Load() || !s.capture.seq.CompareAndSwap(nil, c) {
		return
	}
	if !s.capture.state.CompareAndSwap(capNone, capActive) {
		s.capture.seq.CompareAndSwap(c, nil)
		return
	}
	cross := s.crossContext(c)
	if cross {
		s.dev.gate.mu.Lock() // ordered with deferWork, as raise is
		s.dev.gate.captures.Add(1)
		s.dev.gate.mu.Unlock()
	}
	if s.capture.blocking {
		s.dev.gate.blocking.Add(1)
	}
	c.mu.Lock()
	over := c.over.Load()
	if !over {
		c.joined = append(c.joined, s)
		if cross && !slices.Contains(c.gates, &s.dev.gate) {
			c.gates = append(c.gates, &s.dev.gate)
		}
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
	if s.capture.state.CompareAndSwap(capNone, capActive) {
		s.capture.joinedID.Store(rec.id)
		if s.capture.blocking {
			s.dev.gate.blocking.Add(1)
		}
	}
}

// capID is what the rule knows of a stream's capture: none, a capture
// cudamem saw begin (seq), or one the driver reports (id). legacy marks
// the legacy default stream while a blocking stream of its context
// captures.
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

// captureOf says which capture s is in: atomic loads for an owned stream
// not capturing, a driver query to confirm a flag or for a borrowed
// stream. Nil, zero and closed streams are not capturing.
func (s *Stream) captureOf(op string) (capID, error) {
	if c, ask := s.captureFast(); !ask {
		return c, nil
	}
	ctx, h, err := s.beginQuery(op)
	if err != nil {
		return capID{}, nil // closed meanwhile: the operation reports it
	}
	defer s.endQuery()
	return s.captureAsk(op, ctx, h)
}

// captureOfLocked is captureOf for a caller inside begin/end (which must
// not enter the guard again: a waiting Close would deadlock it).
func (s *Stream) captureOfLocked(op string, ctx, h uintptr) (capID, error) {
	if c, ask := s.captureFast(); !ask {
		return c, nil
	}
	return s.captureAsk(op, ctx, h)
}

// captureFast answers from the flags; ask says the driver must be asked.
func (s *Stream) captureFast() (c capID, ask bool) {
	if s == nil || s.dev == nil || s.guard.IsClosed() {
		return capID{}, false
	}
	switch st := s.capture.state.Load(); {
	case st == capBeginning:
		return capID{capturing: true, seq: s.capture.seq.Load()}, false
	case st == capNone && s.IsDefault():
		if s.dev.gate.blocking.Load() > 0 {
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
	seen := s.capture.seq.Load()
	var status int32
	var id uint64
	var err error
	if p := &s.dev.drv.StreamGetCaptureInfo; p.Found() {
		if r := p.CallCtx(ctx, h, uintptr(unsafe.Pointer(&status)), uintptr(unsafe.Pointer(&id)), 0, 0, 0, 0); !ok(r) {
			err = fail(p, r)
		}
	} else {
		var st CaptureStatus
		st, err = s.status(ctx, h)
		status = int32(st)
	}
	if err != nil {
		return capID{}, &OpError{Op: op, Err: fmt.Errorf("asking whether stream %#x of %v is capturing: %w", h, s.dev, err)}
	}
	if CaptureStatus(status) == CaptureStatusNone {
		if s.capture.state.Load() == capActive {
			s.captureEndedIf(seen) // ended through another value of the handle
		}
		return capID{}, nil
	}
	return capID{capturing: true, seq: s.capture.seq.Load(), id: id}, nil
}

// describe names a stream and its device (view) for messages.
func (s *Stream) describe() string {
	if s == nil || s.dev == nil {
		return "a nil or zero stream"
	}
	return fmt.Sprintf("%s of %v", s.name(), s.dev)
}

// name names a stream alone, for messages that name its context apart.
func (s *Stream) name() string {
	switch {
	case s == nil || s.dev == nil:
		return "a nil or zero stream"
	case s.IsDefault():
		return "the legacy default stream"
	}
	return fmt.Sprintf("stream %#x", s.handle)
}

// RefuseOrder returns nil if work on waiter may be ordered after the work
// submitted to waited so far (an event recorded on waited, then waited on
// by waiter) without harming a capture, and otherwise an error naming op
// and both streams that matches ErrCapturing. It allows the order when
// neither stream captures or both are in the same capture; it refuses it
// when only one captures (waiter would be pulled in, or a capture would
// wait on work outside it) or they are in different captures. Resources
// and buffers call it before ordering streams on their own account. Nil,
// zero and closed streams are not checked here. Two streams not capturing
// cost two atomic loads.
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
	case !w.capturing && waiter.IsDefault():
		return false, Errorf(op, ErrCapturing, "%v cannot join the capture that %s is in: the driver would refuse the wait and invalidate the capture; wait from a stream made by Device.NewStream, or after EndCapture", waiter.describe(), what)
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
// matches ErrCapturing: a capture that cudamem saw begin involves a
// stream of the context (begun there, beginning, or joined by a wait),
// and the wait would invalidate it. (Captures that foreign code began on
// streams cudamem never saw are not counted.)
func (d *Device) RefuseDeviceWait(op string) error {
	if !d.valid() || d.gate.captures.Load() == 0 {
		return nil
	}
	return d.errContextWait(op)
}

func (d *Device) errContextWait(op string) error {
	return Errorf(op, ErrCapturing, "a stream of %v is capturing a graph (or beginning to), and waiting for the whole context would invalidate the capture; do it after EndCapture", d)
}

func (d *Device) errLegacyCapture(op string) error {
	return Errorf(op, ErrCapturing, "the legacy default stream of %v would join the capture of a blocking stream (made without StreamNonBlocking) and invalidate it; use another stream until EndCapture", d)
}

// DeferWhileCapturing arranges for fn to run once no capture that
// cudamem saw begin involves a stream of d's context, and returns true;
// with none in flight it returns false and does nothing, so the caller
// goes ahead itself (how a pool's destruction is put off, not refused).
//
// fn has run when the EndCapture (or Stream.Close) that ends the last
// such capture returns, holding no lock of this package; after a capture
// the driver reported over, it runs on a goroutine of its own. It never
// runs while a capture is in flight, nor inside this call, so it may take
// the caller's locks; it must not end a capture or close a stream.
func (d *Device) DeferWhileCapturing(fn func()) bool {
	if !d.valid() || fn == nil {
		return false
	}
	return d.gate.deferWork(fn)
}

// The gate. A call the rule checks (a cuCtxSynchronize, work on the
// legacy default stream) would invalidate a capture begun between its
// check and its driver call. So the call enters the gate (checks the
// count, counts itself in flight), calls, and leaves; a capture raises
// the counts first, then waits, holding no lock, until no admitted call
// it refuses is in flight. With sequentially consistent atomics one of
// the two sees the other. A call that finds a count raised is refused
// before counting itself, so no stream of new calls can hold a capture
// off. Only a blocking stream's capture (or join) refuses legacy-stream
// calls.

// Kinds of calls that enter the gate.
const (
	callContext = 0 // waits for the whole context (Device.Sync, Context.Close)
	callLegacy  = 1 // calls on the legacy default stream
)

// captureGate is the capture rule's state for one context (one Device value:
// each view of a context has its own).
type captureGate struct {
	// captures counts the captures cudamem saw begin that involve the
	// context (begun, beginning, or joined from another context); above
	// zero, calls of kind callContext are refused.
	captures atomic.Int32
	// blocking counts the context's blocking streams that capture or are
	// about to; above zero, calls of kind callLegacy are refused.
	blocking atomic.Int32
	// calls counts the admitted calls in flight, by kind. A capture waits
	// on idle (L is &mu) until the kinds it refuses are at 0; waiters
	// counts those waiting, so that leave wakes them.
	calls   [2]atomic.Int32
	waiters atomic.Int32
	mu      sync.Mutex
	idle    sync.Cond
	// after holds the work deferred until captures is zero
	// (DeferWhileCapturing), written under mu; pending counts that work
	// until it has run, so that a caller of runDeferred finds it done;
	// runMu serializes the runs.
	after   []func()
	pending atomic.Int32
	runMu   sync.Mutex
}

// bar is the count that refuses calls of kind k.
func (g *captureGate) bar(k int) *atomic.Int32 {
	if k == callContext {
		return &g.captures
	}
	return &g.blocking
}

// enter admits a call of kind k, which must then leave; false means a
// capture in flight or beginning refuses it, and nothing was counted.
func (g *captureGate) enter(k int) bool {
	bar := g.bar(k)
	if bar.Load() > 0 {
		return false // refused before it counts: a capture never waits for it
	}
	g.calls[k].Add(1)
	if bar.Load() > 0 { // raised meanwhile: the capture may be waiting
		g.leave(k)
		return false
	}
	return true
}

// leave ends a call that enter admitted, waking a capture waiting for the
// last one of its kind.
func (g *captureGate) leave(k int) {
	if g.calls[k].Add(-1) == 0 && g.waiters.Load() > 0 {
		g.mu.Lock()
		g.idle.Broadcast()
		g.mu.Unlock()
	}
}

// raise counts a capture about to involve the context (context: begun on
// one of its streams or joined from another context; blocking: by one of
// its blocking streams), then waits until no admitted call it refuses is
// in flight. The caller holds no lock such a call may need; lower undoes
// it.
func (g *captureGate) raise(context, blocking bool) {
	if context {
		g.mu.Lock() // ordered with deferWork
		g.captures.Add(1)
		g.mu.Unlock()
	}
	if blocking {
		g.blocking.Add(1)
	}
	busy := func() bool {
		return context && g.calls[callContext].Load() > 0 || blocking && g.calls[callLegacy].Load() > 0
	}
	if !busy() {
		return
	}
	g.waiters.Add(1)
	g.mu.Lock()
	g.idle.L = &g.mu
	for busy() {
		g.idle.Wait()
	}
	g.mu.Unlock()
	g.waiters.Add(-1)
}

// lower uncounts what raise (or a join) counted. Once no capture is left,
// the deferred work is due: it is started on a goroutine of its own, so
// that none is stranded whatever path ended the capture, and the calls
// that end captures (EndCapture, Stream.Close) run runDeferred before
// they return, which runs it or waits for that goroutine's run.
func (g *captureGate) lower(context, blocking bool) {
	if blocking {
		g.blocking.Add(-1)
	}
	if !context {
		return
	}
	g.mu.Lock()
	due := g.captures.Add(-1) == 0 && len(g.after) > 0
	g.mu.Unlock()
	if due {
		go g.runDeferred()
	}
}

// deferWork queues fn until no capture is counted, reporting false (fn
// not queued) when none is.
func (g *captureGate) deferWork(fn func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.captures.Load() == 0 {
		return false
	}
	g.after = append(g.after, fn)
	g.pending.Add(1)
	return true
}

// runDeferred runs the deferred work if no capture is counted, on the
// calling goroutine, and returns once it has run (also when another
// goroutine was running it). It runs as a call of kind callContext, and
// stops as soon as a capture is counted. The caller holds no lock of this
// package. With nothing deferred it costs one atomic load.
func (g *captureGate) runDeferred() {
	if g.pending.Load() == 0 {
		return
	}
	g.runMu.Lock()
	defer g.runMu.Unlock()
	if !g.enter(callContext) {
		return
	}
	defer g.leave(callContext)
	for {
		g.mu.Lock()
		if g.captures.Load() > 0 || len(g.after) == 0 {
			g.mu.Unlock()
			return
		}
		run := g.after
		g.after = nil
		g.mu.Unlock()
		g.run(run)
	}
}

// run runs the deferred work taken from after. If one panics, the panic
// goes on to the caller, and the rest is queued again and run on a
// goroutine of its own, so that none is lost or left counted.
func (g *captureGate) run(work []func()) {
	done := 0
	defer func() {
		if done == len(work) {
			return
		}
		g.pending.Add(-1) // the one that panicked
		if rest := work[done+1:]; len(rest) > 0 {
			g.mu.Lock()
			g.after = append(g.after, rest...)
			g.mu.Unlock()
			go g.runDeferred()
		}
	}()
	for _, fn := range work {
		fn()
		g.pending.Add(-1)
		done++
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

// activeLocked is active for a caller inside a call on stream s (ctx
// and h its context and handle): when the event was recorded on s itself,
// s is asked without entering its guard again (a waiting Close would
// deadlock a second entry).
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

// refuseLegacy refuses a call named op on the legacy default stream of
// d's context, with an error matching ErrCapturing, while a blocking
// stream of that context captures (the call would join the capture and
// invalidate it). A nil error means the caller must call exitLegacy
// after its driver call.
func (d *Device) refuseLegacy(op string) error {
	if !d.gate.enter(callLegacy) {
		return d.errLegacyCapture(op)
	}
	return nil
}

// exitLegacy ends a legacy-stream call refuseLegacy let through.
func (d *Device) exitLegacy() { d.gate.leave(callLegacy) }
