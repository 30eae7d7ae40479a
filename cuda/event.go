package cuda

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// Event is a CUDA event: a marker in a stream that other streams and the
// host can wait for, and that can time GPU work. Close destroys it; use
// after Close returns an error matching ErrClosed.
type Event struct {
	dev    *Device
	handle uintptr

	guard Guard // calls in flight, then Close
	// diedErr is what Close reports, each time, for an event closed after
	// Context.Close destroyed its green context (Device.diedWith).
	diedErr error

	waiter waiter // the blocking wait SyncContext callers share

	// rec is the capture the last Record went into (nil: it was recorded
	// outside any capture); see capturerule.go.
	rec atomic.Pointer[eventCapture]
}

// NewEvent creates an event on the device. EventDefault records timing.
func (d *Device) NewEvent(flags EventFlags) (*Event, error) {
	ctx, err := d.contextFor("Device.NewEvent")
	if err != nil {
		return nil, err
	}
	e := &Event{dev: d}
	if r := d.drv.EventCreate.CallCtx(ctx, uintptr(unsafe.Pointer(&e.handle)), uintptr(flags)); !ok(r) {
		return nil, fail(&d.drv.EventCreate, r)
	}
	if e.handle == 0 {
		return nil, zeroHandleErr("Device.NewEvent", "cuEventCreate", "event handle")
	}
	return e, nil
}

func (e *Event) get(op string) (uintptr, error) {
	if e == nil || e.dev == nil {
		return 0, Errorf(op, ErrInvalidArgument, "nil or zero event (use Device.NewEvent)")
	}
	if !e.guard.Enter() {
		return 0, &OpError{Op: op, Err: ErrClosed}
	}
	if err := e.dev.check(op); err != nil {
		e.guard.Leave()
		return 0, err
	}
	return e.handle, nil
}

func (e *Event) end() { e.guard.Leave() }

// Handle is the CUevent handle: 0 for a nil, zero or closed Event, so a
// destroyed handle is never handed out (HandleErr says why). The handle is
// valid only while the event stays open.
func (e *Event) Handle() uintptr {
	if e == nil || e.guard.IsClosed() {
		return 0
	}
	return e.handle
}

// HandleErr is Handle with an error: it matches cuda.ErrClosed for a
// closed Event and cuda.ErrInvalidArgument for a nil or zero one.
func (e *Event) HandleErr() (uintptr, error) {
	const op = "Event.HandleErr"
	switch {
	case e == nil || e.dev == nil:
		return 0, Errorf(op, ErrInvalidArgument, "nil or zero event (use Device.NewEvent)")
	case e.guard.IsClosed():
		return 0, &OpError{Op: op, Err: fmt.Errorf("%w: event of %v", ErrClosed, e.dev)}
	}
	return e.handle, nil
}

// IsClosed reports whether Close was called (true for a nil Event).
func (e *Event) IsClosed() bool { return e == nil || e.guard.IsClosed() }

// Record marks the event at the current end of stream s. The event and
// the stream must belong to the same context (an error matching
// ErrInvalidArgument names both otherwise). On a capturing stream the
// record is a node of the capture: until EndCapture the event can be
// waited on by other streams (which joins them to the capture; see
// Stream.WaitEvent), but not synchronized or queried (see Sync).
func (e *Event) Record(s *Stream) error {
	const op = "Event.Record"
	if e == nil || e.dev == nil || e.guard.IsClosed() {
		_, err := e.get(op) // fails (a closed event stays closed), holding nothing
		return err
	}
	// The stream's lock first, then the event's, in the order
	// Stream.WaitEvent takes them: with a Close waiting on each, the
	// other order could deadlock the two.
	ctx, sh, err := s.begin(op)
	if err != nil {
		return err
	}
	defer s.end()
	h, err := e.get(op)
	if err != nil {
		return err
	}
	defer e.end()
	// An event whose context Context.Close destroyed is gone with it:
	// never hand its handle to the driver.
	if err := e.dev.contextClosed(op); err != nil {
		return err
	}
	if ectx, err := e.dev.contextFor(op); err != nil {
		return err
	} else if ectx != ctx {
		return Errorf(op, ErrInvalidArgument, "event of %s recorded on %s of %s: an event and the stream it is recorded on must belong to the same context", e.dev.contextName(), s.name(), s.dev.contextName())
	}
	c, err := s.captureOfLocked(op, ctx, sh)
	if err != nil {
		return err
	}
	if c.legacy {
		return Errorf(op, ErrCapturing, "recording on the legacy default stream of %v would join the capture of a blocking stream (made without StreamNonBlocking) and invalidate it; use another stream until EndCapture", s.dev)
	}
	if err := result(&e.dev.drv.EventRecord, e.dev.drv.EventRecord.CallCtx(ctx, h, sh)); err != nil {
		return err
	}
	if c.capturing {
		e.rec.Store(&eventCapture{seq: c.seq, stream: s, id: c.id})
	} else {
		e.rec.Store(nil)
	}
	return nil
}

// Sync waits until the work before the event's last record has finished.
// An event of a context destroyed by Context.Close (not closed itself) has
// nothing left to wait for: Close waited for the context's work. An event
// last recorded into a capture still in progress is refused with an error
// matching ErrCapturing (the driver forbids waiting for it).
func (e *Event) Sync() error {
	h, err := e.get("Event.Sync")
	if err != nil {
		return err
	}
	defer e.end()
	if e.dev.contextClosedDone() {
		return nil
	}
	if err := e.refuseCaptured("Event.Sync"); err != nil {
		return err
	}
	ctx, err := e.dev.contextFor("Event.Sync")
	if err != nil {
		return err
	}
	return result(&e.dev.drv.EventSynchronize, e.dev.drv.EventSynchronize.CallCtx(ctx, h))
}

// Done reports whether the work before the event has finished (true for
// an event of a context destroyed by Context.Close, as for Sync; refused
// during the capture it was recorded into, as for Sync).
func (e *Event) Done() (bool, error) {
	h, err := e.get("Event.Done")
	if err != nil {
		return false, err
	}
	defer e.end()
	if e.dev.contextClosedDone() {
		return true, nil
	}
	if err := e.refuseCaptured("Event.Done"); err != nil {
		return false, err
	}
	ctx, err := e.dev.contextFor("Event.Done")
	if err != nil {
		return false, err
	}
	r := e.dev.drv.EventQuery.CallCtx(ctx, h)
	switch {
	case ok(r):
		return true, nil
	case Result(int32(r)) == ErrorNotReady:
		return false, nil
	}
	return false, fail(&e.dev.drv.EventQuery, r)
}

// Elapsed returns the GPU time between start and end (both recorded and
// completed, both created with timing).
func Elapsed(start, end *Event) (time.Duration, error) {
	hs, err := start.get("Elapsed")
	if err != nil {
		return 0, err
	}
	defer start.end()
	he, err := end.get("Elapsed")
	if err != nil {
		return 0, err
	}
	defer end.end()
	if err := start.dev.contextClosed("Elapsed"); err != nil {
		return 0, err
	}
	if err := end.dev.contextClosed("Elapsed"); err != nil {
		return 0, err
	}
	if err := start.refuseCaptured("Elapsed"); err != nil {
		return 0, err
	}
	if err := end.refuseCaptured("Elapsed"); err != nil {
		return 0, err
	}
	ctx, err := start.dev.contextFor("Elapsed")
	if err != nil {
		return 0, err
	}
	var ms float32
	p := &start.dev.drv.EventElapsedTime
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&ms)), hs, he); !ok(r) {
		return 0, fail(p, r)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Close destroys the event. It is idempotent. After Context.Close
// destroyed the event's context, Close reports as Stream.Close does:
// close events before their context.
func (e *Event) Close() error {
	if e == nil || e.dev == nil {
		return nil
	}
	return closeHandle(&e.guard, e.dev, "Event.Close", "event", e.handle, &e.diedErr, func(ctx uintptr) error {
		if r := e.dev.drv.EventDestroy.CallCtx(ctx, e.handle); !ok(r) {
			return fail(&e.dev.drv.EventDestroy, r)
		}
		return nil
	})
}
