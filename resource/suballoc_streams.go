package resource

// SubAllocator: stream ordering. Each stream's free list, taking ranges
// freed on another stream (after an event orders the two), and the
// orderer that records and waits on events.

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// listFor returns s's free list, making it if needed.
func (a *SubAllocator) listFor(s *cuda.Stream) *subList {
	if l := a.last; l != nil && l.key == s {
		return l
	}
	l := a.lists[s]
	if l == nil {
		l = &subList{key: s}
		l.id = tableAdd(&a.listTab, &a.freeList, l)
		a.lists[s] = l
		a.streams = append(a.streams, l)
	}
	a.last = l
	return l
}

// tableAdd puts v in *tab under an unused id from *free, else under a new
// one, and returns the id (see SubAllocator.blockTab).
func tableAdd[T any](tab *[]T, free *[]int32, v T) int32 {
	if n := len(*free); n > 0 {
		id := (*free)[n-1]
		*free = (*free)[:n-1]
		(*tab)[id] = v
		return id
	}
	*tab = append(*tab, v)
	return int32(len(*tab) - 1)
}

// slowLocked finds room for n bytes on l (stream s) when l has none: by
// taking another stream's free ranges once s is ordered after it, else by
// growing, else (out of memory) by taking every stream's free ranges in
// case together they coalesce into a fit.
func (a *SubAllocator) slowLocked(l *subList, n uint64, s *cuda.Stream) (int32, error) {
	const op = "SubAllocator.Allocate"
	// s's own cached ranges first: back on l they may coalesce into a fit
	// that needs no ordering.
	if a.flushLocked(a.cacheMap[s]) > 0 {
		if i := a.find(l, n); i != 0 {
			return i, nil
		}
	}
	for pass := 0; ; pass++ {
		for _, t := range a.streams {
			if t == l || t.n == 0 || a.find(t, n) == 0 || !a.order.mayOrder(l.key, t.key) {
				continue
			}
			if err := a.takeLocked(l, t); err != nil {
				return 0, &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes on %s: %w", n, streamName(s), err)}
			}
			return a.find(l, n), nil
		}
		// Before growing, what the other streams' caches hold goes back
		// on their lists, where it may fit (after ordering).
		if pass > 0 || a.flushAllLocked() == 0 {
			break
		}
	}
	err := a.growLocked(op, l, n, max(a.grow, n), s)
	if err == nil {
		return a.find(l, n), nil
	}
	if !errors.Is(err, cuda.ErrorOutOfMemory) {
		return 0, err
	}
	took := false
	for _, t := range a.streams {
		if t == l || t.n == 0 || !a.order.mayOrder(l.key, t.key) {
			continue
		}
		if terr := a.takeLocked(l, t); terr != nil {
			return 0, errors.Join(err, terr)
		}
		took = true
	}
	if took {
		if i := a.find(l, n); i != 0 {
			return i, nil
		}
	}
	return 0, err
}

// takeLocked moves every free range of t to l, after making l's stream
// wait for the work queued on t's.
func (a *SubAllocator) takeLocked(l, t *subList) error {
	if err := a.order.waitFor(l.key, t.key); err != nil {
		return fmt.Errorf("order after %s: %w", streamName(t.key), err)
	}
	for i := t.any(); i != 0; i = t.any() {
		a.unlink(t, i)
		t.n--
		t.bytes -= a.chunks[i].size
		a.chunks[i].list = 0
		a.freeLocked(l, i)
	}
	return nil
}

// streamName names a stream key for messages.
func streamName(s *cuda.Stream) string {
	if s == nil {
		return "the default stream"
	}
	if s.Device() == nil {
		return fmt.Sprintf("stream %p", s)
	}
	if s.IsDefault() {
		return fmt.Sprintf("the default stream of %v", s.Device())
	}
	return fmt.Sprintf("stream %#x", s.Handle())
}

// subOrderer is how the sub-allocator orders streams and waits for them:
// events and stream synchronization in production, a recorder in tests,
// which shows which stream was ordered after which (the fake driver
// completes every call at once, so a wrong wait changes nothing it can
// see). nil stands for the upstream's default stream. waitFor, forget and
// close are called with the sub-allocator's lock held; sync without it.
type subOrderer interface {
	// waitFor makes work submitted to dst from now on wait for the work
	// submitted to src so far, without blocking the host.
	waitFor(dst, src *cuda.Stream) error
	// sync blocks until the work submitted to s so far has finished.
	sync(s *cuda.Stream) error
	// forget drops what the orderer keeps for s (its event). On failure
	// the orderer keeps it, for a later forget or close to retry.
	forget(s *cuda.Stream) error
	// close drops everything; what fails to drop stays, for the next
	// close to retry.
	close() error
	// admit refuses a stream no device made, for an allocation (alloc)
	// one of another device than the upstream's, and then what cuda's
	// RefuseCapture refuses (nil resolved to the default stream).
	admit(op string, s *cuda.Stream, alloc bool) error
	// mayOrder reports whether dst may be ordered after src without
	// harming a capture (cuda.RefuseOrder): a stream's free ranges are
	// taken for another only then, so no stream is pulled into, or made
	// to wait out of, a capture.
	mayOrder(dst, src *cuda.Stream) bool
}

// eventOrder is the production subOrderer: one event per source stream,
// made when first needed and re-recorded for each later ordering (a
// stream's wait captures the event's state when it is queued, so reusing
// it is safe).
type eventOrder struct {
	device func() (*cuda.Device, error) // the upstream's device, for the nil stream
	devID  int                          // the upstream's DeviceID: -1 for host memory
	events map[*cuda.Stream]*cuda.Event
}

func newEventOrder(devID int) *eventOrder {
	return &eventOrder{
		// Host memory (-1): device 0's default stream, as the other
		// resources take it. Looked up at each use (cheap), not cached:
		// a failure on first use must not fail every later call.
		device: func() (*cuda.Device, error) { return cuda.GetDevice(max(devID, 0)) },
		devID:  devID,
		events: make(map[*cuda.Stream]*cuda.Event),
	}
}

// stream resolves a stream argument (cuda.ResolveStream): nil is the
// upstream device's legacy default stream. A stream destroyed since it
// was used is passed through: its work still finishes, and the callers
// wait for it through its device (see waitFor).
func (o *eventOrder) stream(s *cuda.Stream) (*cuda.Stream, error) {
	if s != nil && s.Device() != nil && s.IsClosed() {
		return s, nil
	}
	var d *cuda.Device
	if s == nil {
		var err error
		if d, err = o.device(); err != nil {
			return nil, err
		}
	}
	return d.ResolveStream("SubAllocator", s, false)
}

func (o *eventOrder) admit(op string, s *cuda.Stream, alloc bool) error {
	if s == nil {
		d, err := o.device()
		if err != nil {
			return nil // the operation's own resolution reports it
		}
		s = d.DefaultStream()
	}
	sd := s.Device()
	if sd == nil {
		// Its ranges would sit on a list no wait can ever order: every
		// Trim and Close would fail on it, and its blocks never go back.
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "zero cuda.Stream (use a stream a device made, or nil)")
	}
	if alloc && o.devID >= 0 && sd.Ordinal() != o.devID {
		// As the upstream's own Allocate refuses it, whether or not a
		// range freed on that stream happens to be cached.
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "stream of %v given for memory of GPU %d (use a stream of that device)", sd, o.devID)
	}
	return s.RefuseCapture(op)
}

// streams resolves the two streams of an ordering (see stream).
func (o *eventOrder) streams(dst, src *cuda.Stream) (ds, ss *cuda.Stream, err error) {
	if ds, err = o.stream(dst); err == nil {
		ss, err = o.stream(src)
	}
	return ds, ss, err
}

func (o *eventOrder) mayOrder(dst, src *cuda.Stream) bool {
	// A stream that cannot be resolved is not a capture question:
	// waitFor reports it.
	ds, ss, err := o.streams(dst, src)
	return err != nil || cuda.RefuseOrder("SubAllocator.Allocate", ds, ss) == nil
}

func (o *eventOrder) waitFor(dst, src *cuda.Stream) error {
	ds, ss, err := o.streams(dst, src)
	if err != nil {
		return err
	}
	e := o.events[src]
	if e == nil {
		if e, err = ss.Device().NewEvent(cuda.EventDisableTiming); err != nil {
			return err
		}
		o.events[src] = e
	}
	if err := e.Record(ss); err != nil {
		if !errors.Is(err, cuda.ErrClosed) {
			return err
		}
		// src was destroyed: the driver still finishes its work, and
		// waiting for the device covers it.
		return ss.Device().Sync()
	}
	return ds.WaitEvent(e)
}

func (o *eventOrder) sync(s *cuda.Stream) error {
	ss, err := o.stream(s)
	if err != nil {
		return err
	}
	if err := ss.Sync(); err != nil {
		if !errors.Is(err, cuda.ErrClosed) {
			return err
		}
		return ss.Device().Sync() // destroyed: see waitFor
	}
	return nil
}

// forget destroys s's event. An event the driver fails to destroy stays
// in the map, so that a later forget or close retries it instead of
// leaking it.
func (o *eventOrder) forget(s *cuda.Stream) error {
	e := o.events[s]
	if e == nil {
		return nil
	}
	if err := e.Close(); err != nil {
		return err
	}
	delete(o.events, s)
	return nil
}

// close destroys every event; those the driver fails to destroy stay for
// the next close (see forget).
func (o *eventOrder) close() error {
	var errs []error
	for s, e := range o.events {
		if err := e.Close(); err != nil {
			errs = append(errs, fmt.Errorf("destroy the event of %s: %w", streamName(s), err))
			continue
		}
		delete(o.events, s)
	}
	return errors.Join(errs...)
}
