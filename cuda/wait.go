package cuda

import (
	"context"
	"sync"
	"time"
)

// The driver's blocking waits (cuStreamSynchronize, cuEventSynchronize,
// cuCtxSynchronize) cannot be interrupted: a goroutine blocked in one holds
// its OS thread until the GPU finishes. The Context variants below wait
// without that. Streams and events are polled from the calling goroutine
// (cuStreamQuery, cuEventQuery: no goroutine and no thread is left behind
// when the context ends). A device has no query, so its waits share one
// goroutine per device that runs cuCtxSynchronize while anyone waits; a
// cancelled waiter returns at once and that goroutine ends with the GPU's
// work, whatever the number of waiters.

// Polling schedule: query back to back for spinFor (a short kernel or copy
// finishes within it, and the caller wakes within a query's cost), then
// sleep between queries, doubling from minSleep to maxSleep. A long wait
// thus costs one query per maxSleep, and wakes at most maxSleep (plus timer
// slack) after the GPU finished.
const (
	spinFor  = 50 * time.Microsecond
	minSleep = 10 * time.Microsecond
	maxSleep = 500 * time.Microsecond
)

// ctxError names op and wraps ctx's error, so errors.Is(err,
// context.Canceled) and errors.Is(err, context.DeadlineExceeded) hold.
func ctxError(op string, ctx context.Context) error {
	err := context.Cause(ctx)
	if err == nil {
		err = ctx.Err()
	}
	return &OpError{Op: op, Err: err}
}

// poll calls done until it reports true or fails, or ctx ends.
func poll(ctx context.Context, op string, done func() (bool, error)) error {
	if ctx == nil {
		return Errorf(op, ErrInvalidArgument, "nil context (use context.Background())")
	}
	start := time.Now()
	var timer *time.Timer
	sleep := minSleep
	for {
		ok, err := done()
		if err != nil || ok {
			if timer != nil {
				timer.Stop()
			}
			return err
		}
		if ctx.Err() != nil {
			if timer != nil {
				timer.Stop()
			}
			return ctxError(op, ctx)
		}
		if time.Since(start) < spinFor {
			continue
		}
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctxError(op, ctx)
		case <-timer.C:
		}
		sleep = min(2*sleep, maxSleep)
	}
}

// SyncContext waits, like Sync, until all work submitted to the stream has
// finished, or until ctx is done: then it returns an error naming the
// operation that wraps ctx's error (context.Canceled or
// context.DeadlineExceeded; the work goes on on the GPU). It polls the
// stream from the calling goroutine, so a cancelled wait leaves no
// goroutine or thread behind; it wakes at most about half a millisecond
// after the work finished (see BENCHMARKS.md for the measured cost).
func (s *Stream) SyncContext(ctx context.Context) error {
	const op = "Stream.SyncContext"
	if _, _, err := s.begin(op); err != nil {
		return err
	}
	s.end()
	return poll(ctx, op, func() (bool, error) {
		done, err := s.Done()
		if err != nil {
			return false, &OpError{Op: op, Err: err}
		}
		return done, nil
	})
}

// SyncContext waits, like Sync, until the work before the event's last
// record has finished, or until ctx is done (see Stream.SyncContext).
func (e *Event) SyncContext(ctx context.Context) error {
	const op = "Event.SyncContext"
	if _, err := e.get(op); err != nil {
		return err
	}
	e.end()
	return poll(ctx, op, func() (bool, error) {
		done, err := e.Done()
		if err != nil {
			return false, &OpError{Op: op, Err: err}
		}
		return done, nil
	})
}

// SyncContext waits, like Sync, for all work on the device to finish, or
// until ctx is done: then it returns an error naming the operation that
// wraps ctx's error. The device has no non-blocking query, so one
// goroutine per device runs cuCtxSynchronize for every caller waiting at
// the time; a cancelled caller returns at once, and that goroutine ends
// when the device's work does (it is never one per wait).
func (d *Device) SyncContext(ctx context.Context) error {
	const op = "Device.SyncContext"
	if ctx == nil {
		return Errorf(op, ErrInvalidArgument, "nil context (use context.Background())")
	}
	if _, err := d.contextFor(op); err != nil {
		return err
	}
	r := d.syncer.join(d)
	select {
	case <-r.done:
		if r.err != nil {
			return &OpError{Op: op, Err: r.err}
		}
		return nil
	case <-ctx.Done():
		return ctxError(op, ctx)
	}
}

// deviceSyncer shares cuCtxSynchronize calls among a device's waiters. A
// caller joins the next round, never one already running: a sync that
// began before the caller's work was submitted need not cover it.
type deviceSyncer struct {
	mu      sync.Mutex
	running bool
	next    *syncRound
}

type syncRound struct {
	done chan struct{}
	err  error // set before done is closed
}

func (y *deviceSyncer) join(d *Device) *syncRound {
	y.mu.Lock()
	defer y.mu.Unlock()
	if y.next == nil {
		y.next = &syncRound{done: make(chan struct{})}
	}
	r := y.next
	if !y.running {
		y.running = true
		y.next = nil
		go y.run(d, r)
	}
	return r
}

func (y *deviceSyncer) run(d *Device, r *syncRound) {
	for {
		r.err = d.Sync()
		close(r.done)
		y.mu.Lock()
		r = y.next
		y.next = nil
		if r == nil {
			y.running = false
			y.mu.Unlock()
			return
		}
		y.mu.Unlock()
	}
}
