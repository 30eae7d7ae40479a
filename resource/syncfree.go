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
