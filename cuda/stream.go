package cuda

import (
	"errors"
	"fmt"
	"sync"
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
// Methods are safe for concurrent use, but closing a stream while other
// goroutines still submit work to it is a program error (as in CUDA).
type Stream struct {
	dev    *Device
	handle uintptr
	owned  bool

	mu     sync.RWMutex
	closed bool

	waiter waiter // the blocking wait SyncContext callers share
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
	r := d.drv.StreamCreateWithPriority.CallCtx(ctx, uintptr(unsafe.Pointer(&s.handle)), uintptr(flags), uintptr(int64(priority)))
	if !ok(r) {
		return nil, fail(&d.drv.StreamCreateWithPriority, r)
	}
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

// Handle is the CUstream handle (0 for the legacy default stream).
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return s.handle
}

// IsDefault reports whether s is a legacy default stream.
func (s *Stream) IsDefault() bool { return s != nil && !s.owned }

// begin returns the context and handle for a call on s, holding a read
// lock that end releases, so Close cannot destroy the stream mid-call.
func (s *Stream) begin(op string) (ctx, handle uintptr, err error) {
	if s == nil || s.dev == nil {
		return 0, 0, Errorf(op, ErrInvalidArgument, "nil or zero stream (use Device.NewStream, or Device.DefaultStream for the legacy default stream)")
	}
	s.mu.RLock()
	if s.closed {
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

func (s *Stream) end() { s.mu.RUnlock() }

// Sync waits until all work submitted to the stream has finished.
func (s *Stream) Sync() error {
	ctx, h, err := s.begin("Stream.Sync")
	if err != nil {
		return err
	}
	defer s.end()
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
func (s *Stream) WaitEvent(e *Event) error {
	ctx, h, err := s.begin("Stream.WaitEvent")
	if err != nil {
		return err
	}
	defer s.end()
	eh, err := e.get("Stream.WaitEvent")
	if err != nil {
		return err
	}
	defer e.end()
	return result(&s.dev.drv.StreamWaitEvent, s.dev.drv.StreamWaitEvent.CallCtx(ctx, h, eh, 0))
}

// WaitStream makes future work on s wait for all work submitted to other
// so far (through a temporary event).
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
// idempotent; closing a default stream does nothing.
func (s *Stream) Close() error {
	if s == nil || !s.owned || s.dev == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	ctx, err := s.dev.contextFor("Stream.Close")
	if err != nil {
		return err
	}
	if r := s.dev.drv.StreamDestroy.CallCtx(ctx, s.handle); !ok(r) {
		return fail(&s.dev.drv.StreamDestroy, r)
	}
	s.closed = true
	return nil
}
