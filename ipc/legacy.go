package ipc

import (
	"encoding/binary"
	"fmt"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// LegacyHandle shares memory from cuMemAlloc (resource.NewSyncDevice) the
// way CuPy and PyTorch do (cuIpcGetMemHandle): 64 opaque bytes plus the
// size, with no file descriptor. Pool memory uses ExportBuffer instead.
type LegacyHandle struct {
	Handle cuda.IPCMemHandle
	Size   uint64
}

// LegacyHandleSize is the length of an encoded LegacyHandle: magic (8),
// size (8), handle (64).
const LegacyHandleSize = 8 + 8 + cuda.IPCHandleSize

var legacyMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'L'}

// MarshalBinary encodes h.
func (h LegacyHandle) MarshalBinary() ([]byte, error) {
	b := make([]byte, LegacyHandleSize)
	copy(b, legacyMagic[:])
	binary.LittleEndian.PutUint64(b[8:], h.Size)
	copy(b[16:], h.Handle.Reserved[:])
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced, rejecting anything
// else with an error wrapping ErrBadDescriptor.
func (h *LegacyHandle) UnmarshalBinary(b []byte) error {
	if len(b) != LegacyHandleSize || [8]byte(b[:8]) != legacyMagic {
		return fmt.Errorf("%w: not a cudamem legacy IPC handle (%d bytes)", ErrBadDescriptor, len(b))
	}
	h.Size = binary.LittleEndian.Uint64(b[8:])
	copy(h.Handle.Reserved[:], b[16:])
	return nil
}

// ExportLegacy returns a legacy IPC handle for b, which must be device
// memory from cuMemAlloc (a whole allocation).
func ExportLegacy(b *buffer.Buffer) (LegacyHandle, error) {
	const op = "ipc.ExportLegacy"
	if b == nil {
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	if b.IsClosed() {
		return LegacyHandle{}, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	// The driver exports whole allocations: a view would be mapped at its
	// allocation's base on the other side, with the wrong bytes.
	info, err := cuda.QueryPointer(b.Ptr())
	if err != nil {
		return LegacyHandle{}, &cuda.OpError{Op: op, Err: err}
	}
	if !b.IsOwned() || info.RangeBase != b.Ptr() || info.RangeSize < b.Size() || info.Pool != 0 {
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is not a whole cuMemAlloc allocation (use resource.SyncDevice; pool memory goes through ExportBuffer)", b)
	}
	dev, err := b.Device()
	if err != nil {
		return LegacyHandle{}, err
	}
	h, err := dev.IPCGetMemHandle(b.Ptr())
	if err != nil {
		return LegacyHandle{}, fmt.Errorf("ipc.ExportLegacy %v: %w", b, err)
	}
	return LegacyHandle{Handle: h, Size: b.Size()}, nil
}

// OpenLegacy maps memory another process exported with ExportLegacy. The
// returned buffer's Close unmaps it (cuIpcCloseMemHandle). A process cannot
// open its own handles.
func OpenLegacy(dev *cuda.Device, h LegacyHandle) (*buffer.Buffer, error) {
	if dev == nil {
		return nil, cuda.Errorf("ipc.OpenLegacy", cuda.ErrInvalidArgument, "nil device")
	}
	p, err := dev.IPCOpenMemHandle(h.Handle, cuda.IPCMemLazyEnablePeerAccess)
	if err != nil {
		return nil, fmt.Errorf("ipc.OpenLegacy (%d bytes): %w", h.Size, err)
	}
	return buffer.Owned(p, h.Size, &legacyMapping{dev: dev}, dev.DefaultStream()), nil
}

// legacyMapping is the MemoryResource behind OpenLegacy's buffers: it only
// unmaps.
type legacyMapping struct{ dev *cuda.Device }

func (m *legacyMapping) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return nil, cuda.Errorf("ipc.legacyMapping.Allocate", cuda.ErrInvalidArgument, "cannot allocate from memory opened with OpenLegacy")
}

// Deallocate waits for s (nil: the legacy default stream) and unmaps:
// cuIpcCloseMemHandle is not stream-ordered.
func (m *legacyMapping) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if s == nil {
		s = m.dev.DefaultStream()
	}
	if err := s.Sync(); err != nil {
		return err
	}
	return m.dev.IPCCloseMemHandle(p)
}

func (m *legacyMapping) DeviceAccessible() bool { return true }
func (m *legacyMapping) HostAccessible() bool   { return false }
func (m *legacyMapping) DeviceID() int          { return m.dev.Ordinal() }
