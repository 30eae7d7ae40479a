package resource

import (
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// syncFree is the Deallocate of the synchronous resources (SyncDevice,
// Managed, LegacyPinned): their free calls are not stream ordered, so it
// waits for s (nil: dev's legacy default stream), then runs free. Errors
// name kind.Deallocate and the allocation.
func syncFree(kind string, dev *cuda.Device, ptr cuda.DevicePtr, size uint64, s *cuda.Stream, free func() error) error {
	if s == nil {
		s = dev.DefaultStream()
	}
	// A synchronous free waits for the stream, which a capture forbids:
	// refuse before touching it, so the capture stays valid and the
	// buffer open.
	if err := refuseCapture(kind+".Deallocate", s); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays allocated)", err, uint64(ptr), size)
	}
	err := s.Sync()
	if err == nil {
		err = free()
	}
	if err != nil {
		return &cuda.OpError{Op: kind + ".Deallocate", Err: fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err)}
	}
	return nil
}

// syncStream resolves the stream argument of op on a synchronous
// resource: nil means dev's legacy default stream; a zero or closed Stream
// is an error, and so, when sameDevice is set, is another GPU's stream (a
// stream of another context of dev's GPU only orders the free).
func syncStream(op string, dev *cuda.Device, s *cuda.Stream, sameDevice bool) (*cuda.Stream, error) {
	if s == nil {
		return dev.DefaultStream(), nil
	}
	d := s.Device()
	if d == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "zero stream (use Device.NewStream, or nil for the default stream)")
	}
	if sameDevice && !d.SameGPU(dev) {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "stream of %v given to a resource of %v", d, dev)
	}
	// A synchronous allocation is not stream-ordered: captured, it would
	// be made once now rather than at each launch of the graph.
	if err := refuseCapture(op, s); err != nil {
		return nil, err
	}
	// The allocation itself ignores the stream, but the Buffer records it
	// for its Close: a closed stream would make a buffer whose Close
	// always fails.
	if _, err := s.Done(); err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("stream: %w", err)}
	}
	return s, nil
}
