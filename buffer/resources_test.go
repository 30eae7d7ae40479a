package buffer_test

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// The GPU tests' resources are cuda.core's dummy ones: synchronous driver
// allocations, freed after the stream drains.

// deviceResource allocates device memory with cuMemAlloc.
type deviceResource struct {
	dev *cuda.Device

	mu    sync.Mutex
	frees []*cuda.Stream // the stream of each completed Deallocate
}

func (m *deviceResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if size == 0 {
		return 0, s, nil
	}
	p, err := m.dev.MemAlloc(size)
	if err != nil {
		return 0, nil, err
	}
	return p, s, nil
}

func (m *deviceResource) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if err := drain(m.dev, s); err != nil {
		return err
	}
	if err := m.dev.MemFree(p); err != nil {
		return err
	}
	m.mu.Lock()
	m.frees = append(m.frees, s) // after the free, so tests see it done
	m.mu.Unlock()
	return nil
}

func (m *deviceResource) DeviceAccessible() bool { return true }
func (m *deviceResource) HostAccessible() bool   { return false }
func (m *deviceResource) DeviceID() int          { return m.dev.Ordinal() }

// pinnedResource allocates page-locked host memory with cuMemHostAlloc.
type pinnedResource struct{ dev *cuda.Device }

func (m *pinnedResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if size == 0 {
		return 0, s, nil
	}
	p, err := m.dev.MemHostAlloc(size, cuda.MemHostAllocPortable)
	if err != nil {
		return 0, nil, err
	}
	return cuda.DevicePtr(uintptr(p)), s, nil
}

func (m *pinnedResource) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if err := drain(m.dev, s); err != nil {
		return err
	}
	return m.dev.MemFreeHost(hostPtr(p))
}

func (m *pinnedResource) DeviceAccessible() bool { return true }
func (m *pinnedResource) HostAccessible() bool   { return true }
func (m *pinnedResource) DeviceID() int          { return -1 }

// managedResource allocates unified memory with cuMemAllocManaged.
type managedResource struct{ dev *cuda.Device }

func (m *managedResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if size == 0 {
		return 0, s, nil
	}
	p, err := m.dev.MemAllocManaged(size, cuda.MemAttachGlobal)
	if err != nil {
		return 0, nil, err
	}
	return p, s, nil
}

func (m *managedResource) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if err := drain(m.dev, s); err != nil {
		return err
	}
	return m.dev.MemFree(p)
}

func (m *managedResource) DeviceAccessible() bool { return true }
func (m *managedResource) HostAccessible() bool   { return true }
func (m *managedResource) DeviceID() int          { return m.dev.Ordinal() }

// drain waits for s, or for the whole device when s is nil.
func drain(d *cuda.Device, s *cuda.Stream) error {
	if s == nil {
		return d.Sync()
	}
	return s.Sync()
}

// hostPtr converts a host address the driver gave out back to a pointer.
func hostPtr(p cuda.DevicePtr) unsafe.Pointer {
	a := uintptr(p)
	return *(*unsafe.Pointer)(unsafe.Pointer(&a))
}

// kinds are the GPU resource kinds of cuda.core's memory tests.
var kinds = []string{"device", "unified", "pinned"}

func newResource(t testing.TB, kind string, d *cuda.Device) buffer.MemoryResource {
	t.Helper()
	switch kind {
	case "device":
		return &deviceResource{dev: d}
	case "unified":
		f, err := d.Features()
		require.NoError(t, err)
		if !f.ManagedMemory {
			t.Skipf("%v has no managed memory", d)
		}
		return &managedResource{dev: d}
	case "pinned":
		return &pinnedResource{dev: d}
	}
	t.Fatalf("unknown resource kind %q", kind)
	return nil
}

// alloc allocates from mr on s and closes the buffer when the test ends.
func alloc(t testing.TB, mr buffer.MemoryResource, size uint64, s *cuda.Stream) *buffer.Buffer {
	t.Helper()
	b, err := buffer.Allocate(mr, size, s)
	require.NoError(t, err)
	require.Equal(t, size, b.Size())
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	return b
}
