package resource

import (
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// The synchronous resources (SyncDevice, Managed, LegacyPinned) share
// their AllocatePtr and Deallocate: syncAlloc and syncFree below, kind
// naming the type in errors. Their calls are not stream ordered, so the
// stream is only waited for (on free) or recorded (on allocate).

// syncAlloc refuses a zero resource (dev nil), resolves s (syncStream),
// checks size and, unless it is 0, runs alloc.
func syncAlloc(kind string, dev *cuda.Device, size uint64, s *cuda.Stream, sameDevice bool, alloc func() (cuda.DevicePtr, error)) (cuda.DevicePtr, *cuda.Stream, error) {
	op := kind + ".Allocate"
	if dev == nil {
		return 0, nil, errZero(kind, "Allocate")
	}
	s, err := syncStream(op, dev, s, sameDevice)
	if err != nil {
		return 0, nil, err
	}
	if err := checkSize(op, "size", size); err != nil {
		return 0, nil, err
	}
	if size == 0 {
		return 0, s, nil
	}
	p, err := alloc()
	if err != nil {
		return 0, nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes on %v: %w", size, dev, err)}
	}
	return p, s, nil
}

// syncFree waits for s (nil: dev's legacy default stream), then runs free.
// A zero ptr is a no-op; a zero resource (dev nil) is refused.
func syncFree(kind string, dev *cuda.Device, ptr cuda.DevicePtr, size uint64, s *cuda.Stream, free func() error) error {
	op := kind + ".Deallocate"
	switch {
	case ptr == 0:
		return nil
	case dev == nil:
		return errZero(kind, "Deallocate")
	case s == nil:
		s = dev.DefaultStream()
	}
	// A synchronous free waits for the stream, which a capture forbids:
	// refuse before touching it, so the capture stays valid and the
	// buffer open.
	if err := refuseCapture(op, s); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays allocated)", err, uint64(ptr), size)
	}
	err := s.Sync()
	if err == nil {
		err = free()
	}
	if err != nil {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err)}
	}
	return nil
}

// syncStream resolves the stream argument of op on a synchronous resource
// (cuda.ResolveStream on dev; with sameDevice, another GPU's stream is
// refused) and refuses a capturing one: a synchronous allocation is not
// stream-ordered, so captured it would be made once now rather than at
// each launch of the graph.
func syncStream(op string, dev *cuda.Device, s *cuda.Stream, sameDevice bool) (*cuda.Stream, error) {
	s, err := dev.ResolveStream(op, s, sameDevice)
	if err != nil {
		return nil, err
	}
	if err := refuseCapture(op, s); err != nil {
		return nil, err
	}
	return s, nil
}
