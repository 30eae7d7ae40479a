package resource

import (
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// LegacyPinned allocates page-locked host memory with cuMemHostAlloc
// (portable, device-mapped) and frees it with cuMemFreeHost, after waiting
// for the stream: cuda.core's LegacyPinnedMemoryResource. Each pair costs
// about a millisecond; prefer PinnedPool where the driver has host pools.
// The CPU and every device may use the memory (under unified addressing
// Buffer.Ptr is the host address). Calls run in device 0's context; the
// nil stream is device 0's legacy default stream. LegacyPinned holds no
// driver object, so it has no Close. It is safe for concurrent use.
type LegacyPinned struct {
	dev *cuda.Device
}

var _ buffer.MemoryResource = (*LegacyPinned)(nil)

// NewLegacyPinned returns a legacy pinned host memory resource.
func NewLegacyPinned() (*LegacyPinned, error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return nil, &cuda.OpError{Op: "NewLegacyPinned", Err: err}
	}
	return &LegacyPinned{dev: dev}, nil
}

// Allocate returns a new buffer of size bytes of pinned host memory. The
// allocation is synchronous; s (nil: device 0's legacy default stream) is
// recorded as the stream Close frees on. Size 0 returns an empty buffer
// without calling the driver.
func (r *LegacyPinned) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address (0 for size 0) and the stream Close frees on (nil resolved).
func (r *LegacyPinned) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return syncAlloc("LegacyPinned", r.device(), size, s, false, func() (cuda.DevicePtr, error) {
		p, err := r.dev.MemHostAlloc(size, cuda.MemHostAllocPortable|cuda.MemHostAllocDeviceMap)
		return devicePtr(p), err
	})
}

// Deallocate waits for s (nil: device 0's legacy default stream), then
// frees the memory. A zero ptr is a no-op.
func (r *LegacyPinned) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return syncFree("LegacyPinned", r.device(), ptr, size, s, func() error { return r.dev.MemFreeHost(hostPtr(ptr)) })
}

// device is the device whose context serves the calls (nil for a nil or
// zero value).
func (r *LegacyPinned) device() *cuda.Device {
	if r == nil {
		return nil
	}
	return r.dev
}

// DeviceAccessible and HostAccessible report true: every device and the
// CPU may use the memory.
func (r *LegacyPinned) DeviceAccessible() bool { return true }
func (r *LegacyPinned) HostAccessible() bool   { return true }

// DeviceID reports -1: pinned memory belongs to no device.
func (r *LegacyPinned) DeviceID() int { return -1 }

// String describes the resource for logs.
func (r *LegacyPinned) String() string { return "LegacyPinned" }

// devicePtr is the unified address of host memory from the driver.
func devicePtr(p unsafe.Pointer) cuda.DevicePtr { return cuda.DevicePtr(uintptr(p)) }

// hostPtr turns a unified address of driver-allocated host memory back
// into a pointer. The memory is not the Go heap's, so the collector does
// not care about it; reading the word through memory keeps vet's
// uintptr-to-pointer rule (meant for Go memory) out of the way.
func hostPtr(p cuda.DevicePtr) unsafe.Pointer {
	u := uintptr(p)
	return *(*unsafe.Pointer)(unsafe.Pointer(&u))
}
