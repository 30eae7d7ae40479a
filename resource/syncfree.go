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
	err := s.Sync()
	if err == nil {
		err = free()
	}
	if err != nil {
		return &cuda.OpError{Op: kind + ".Deallocate", Err: fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err)}
	}
	return nil
}
