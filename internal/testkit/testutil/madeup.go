package testutil

import "github.com/cudamem/cudamem/cuda"

// MadeUp is a buffer.MemoryResource of made-up addresses, so that tests and
// runnable examples of adaptors, logs and traces work without a GPU: each
// allocation takes the next 256-byte aligned address from 0x7f0000000000,
// and nothing is freed or touched. Its zero value is ready to use.
type MadeUp struct{ next cuda.DevicePtr }

// AllocatePtr returns the next made-up address and s.
func (m *MadeUp) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if m.next == 0 {
		m.next = 0x7f0000000000
	}
	p := m.next
	m.next += cuda.DevicePtr((size + 255) &^ 255)
	return p, s, nil
}

// Deallocate does nothing.
func (m *MadeUp) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }

// DeviceAccessible reports true.
func (m *MadeUp) DeviceAccessible() bool { return true }

// HostAccessible reports false.
func (m *MadeUp) HostAccessible() bool { return false }

// DeviceID reports device 0.
func (m *MadeUp) DeviceID() int { return 0 }
