package resource

import (
	"fmt"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// SyncDevice allocates device memory with cuMemAlloc and frees it with
// cuMemFree: cuda.core's _SynchronousMemoryResource, RMM's
// cuda_memory_resource. It works on every device, including those without
// memory pools, where Default picks it; elsewhere prefer DevicePool (a
// SyncDevice pair costs about 100 µs and cuMemFree may synchronize the
// device). Deallocate first waits for the stream.
//
// SyncDevice holds no driver object, so it has no Close. It is safe for
// concurrent use.
type SyncDevice struct {
	dev *cuda.Device
}

var _ buffer.MemoryResource = (*SyncDevice)(nil)

// NewSyncDevice returns a synchronous device memory resource for dev.
func NewSyncDevice(dev *cuda.Device) (*SyncDevice, error) {
	if err := checkDevice("NewSyncDevice", dev); err != nil {
		return nil, err
	}
	return &SyncDevice{dev: dev}, nil
}

// Allocate returns a new buffer of size bytes of device memory. The
// allocation is synchronous; s (nil: the device's legacy default stream)
// is recorded as the stream Close frees on. Size 0 returns an empty buffer
// without calling the driver.
func (r *SyncDevice) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address (0 for size 0) and the stream Close frees on (nil resolved).
func (r *SyncDevice) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return syncAlloc("SyncDevice", r.Device(), size, s, true, func() (cuda.DevicePtr, error) { return r.dev.MemAlloc(size) })
}

// Deallocate waits for s (nil: the device's legacy default stream), then
// frees the memory. A zero ptr is a no-op.
func (r *SyncDevice) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return syncFree("SyncDevice", r.Device(), ptr, size, s, func() error { return r.dev.MemFree(ptr) })
}

// DeviceAccessible reports true and HostAccessible false: the memory is
// the device's.
func (r *SyncDevice) DeviceAccessible() bool { return true }
func (r *SyncDevice) HostAccessible() bool   { return false }

// DeviceID is the device's ordinal (-1 for a nil or zero value).
func (r *SyncDevice) DeviceID() int { return r.Device().Ordinal() }

// Device is the resource's device.
func (r *SyncDevice) Device() *cuda.Device {
	if r == nil {
		return nil
	}
	return r.dev
}

// String describes the resource for logs.
func (r *SyncDevice) String() string {
	if r == nil || r.dev == nil {
		return "SyncDevice(nil)"
	}
	return fmt.Sprintf("SyncDevice(%v)", r.dev)
}
