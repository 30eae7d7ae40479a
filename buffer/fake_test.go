package buffer_test

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// noDevice is the device ordinal fake resources report: no machine has it,
// so a call that would resolve a nil stream fails in cuda.GetDevice before
// any fake address could reach the driver.
const noDevice = 1 << 20

var (
	errFakeFree  = errors.New("fake: deallocate failed")
	errFakePanic = errors.New("fake: deallocate panicked")
)

// fakeResource hands out fake addresses and counts what it frees. Buffers
// from it must never reach the driver: CPU tests exercise only what Go
// checks before any driver call.
type fakeResource struct {
	devAcc, hostAcc bool
	device          int

	mu        sync.Mutex
	next      cuda.DevicePtr
	live      map[cuda.DevicePtr]uint64
	freed     []cuda.DevicePtr
	streams   []*cuda.Stream // the stream of each Deallocate
	failFrees int            // fail this many Deallocate calls
	// partlyFrees: this many Deallocate calls free the memory and then
	// fail with an error wrapping buffer.ErrPartlyFreed, as a resource
	// whose cleanup after the free failed does.
	partlyFrees int
	// panicFrees: this many Deallocate calls panic, as a user's resource
	// may.
	panicFrees int
}

func newFake() *fakeResource {
	return &fakeResource{devAcc: true, device: noDevice, next: 0xfa4e_0000_0000, live: map[cuda.DevicePtr]uint64{}}
}

func (m *fakeResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.next
	m.next += cuda.DevicePtr((size+255)&^255 + 256)
	m.live[p] = size
	return p, s, nil
}

func (m *fakeResource) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.panicFrees > 0 {
		m.panicFrees--
		panic(errFakePanic)
	}
	if m.failFrees > 0 {
		m.failFrees--
		return errFakeFree
	}
	if got, ok := m.live[p]; !ok || got != size {
		return fmt.Errorf("fake: deallocate of %#x (%d bytes): not allocated here (live size %d, %v)", uint64(p), size, got, ok)
	}
	delete(m.live, p)
	m.freed = append(m.freed, p)
	m.streams = append(m.streams, s)
	if m.partlyFrees > 0 {
		m.partlyFrees--
		return fmt.Errorf("fake: %#x freed, but its bookkeeping failed: %w", uint64(p), buffer.ErrPartlyFreed)
	}
	return nil
}

func (m *fakeResource) DeviceAccessible() bool { return m.devAcc }
func (m *fakeResource) HostAccessible() bool   { return m.hostAcc }
func (m *fakeResource) DeviceID() int          { return m.device }

func (m *fakeResource) alloc(size uint64) *buffer.Buffer {
	b, _ := buffer.Allocate(m, size, nil)
	return b
}

func (m *fakeResource) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

func (m *fakeResource) wasFreed(p cuda.DevicePtr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range m.freed {
		if f == p {
			return true
		}
	}
	return false
}

// heapResource is cuda.core's host dummy: memory from the Go heap, host-
// accessible only. Its buffers may be viewed with Bytes, and copied to and
// from Go slices (CPU moves, no stream), but not copied to other buffers
// (that would need a stream, hence the driver).
type heapResource struct {
	mu   sync.Mutex
	mem  map[cuda.DevicePtr][]byte
	free int
}

func newHeap() *heapResource { return &heapResource{mem: map[cuda.DevicePtr][]byte{}} }

func (m *heapResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	b := make([]byte, size+1) // +1: a distinct, non-nil address even for size 0
	p := cuda.DevicePtr(uintptr(unsafe.Pointer(&b[0])))
	m.mu.Lock()
	m.mem[p] = b
	m.mu.Unlock()
	return p, s, nil
}

func (m *heapResource) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.mem[p]; !ok {
		return fmt.Errorf("heap: %#x not allocated here", uint64(p))
	}
	delete(m.mem, p)
	m.free++
	return nil
}

func (m *heapResource) DeviceAccessible() bool { return false }
func (m *heapResource) HostAccessible() bool   { return true }
func (m *heapResource) DeviceID() int          { return -1 }
