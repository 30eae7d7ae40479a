package ipc

import (
	"encoding/binary"
	"errors"
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
// version (2), reserved (2), size (8), handle (64), CRC-32 of everything
// before it (4).
const LegacyHandleSize = 8 + 2 + 2 + 8 + cuda.IPCHandleSize + 4

const legacyVersion = 1

var legacyMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'L'}

// MarshalBinary encodes h in a fixed, versioned, checksummed layout.
func (h LegacyHandle) MarshalBinary() ([]byte, error) {
	b := make([]byte, LegacyHandleSize)
	copy(b, legacyMagic[:])
	binary.LittleEndian.PutUint16(b[8:], legacyVersion)
	binary.LittleEndian.PutUint64(b[12:], h.Size)
	copy(b[20:20+cuda.IPCHandleSize], h.Handle.Reserved[:])
	end := LegacyHandleSize - 4
	binary.LittleEndian.PutUint32(b[end:], checksum(b[:end]))
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced, rejecting anything
// else (length, magic, version, reserved bytes, checksum) with an error
// wrapping ErrBadDescriptor; h is left unchanged then. As with
// descriptors, the checksum catches corruption, not lies: OpenLegacy bounds
// the size by what the driver mapped.
func (h *LegacyHandle) UnmarshalBinary(b []byte) error {
	if h == nil {
		return cuda.Errorf("ipc.LegacyHandle.UnmarshalBinary", cuda.ErrInvalidArgument, "nil *LegacyHandle")
	}
	end := LegacyHandleSize - 4
	switch {
	case len(b) != LegacyHandleSize:
		return fmt.Errorf("%w: %d bytes, a legacy IPC handle has %d", ErrBadDescriptor, len(b), LegacyHandleSize)
	case [8]byte(b[:8]) != legacyMagic:
		return fmt.Errorf("%w: not a cudamem legacy IPC handle (magic %q)", ErrBadDescriptor, b[:8])
	case binary.LittleEndian.Uint16(b[8:]) != legacyVersion:
		return fmt.Errorf("%w: legacy handle version %d, this library reads %d", ErrBadDescriptor, binary.LittleEndian.Uint16(b[8:]), legacyVersion)
	case binary.LittleEndian.Uint32(b[end:]) != checksum(b[:end]):
		return fmt.Errorf("%w: legacy handle checksum mismatch (corrupted in transit?)", ErrBadDescriptor)
	case b[10] != 0 || b[11] != 0:
		return fmt.Errorf("%w: reserved bytes % x are not zero", ErrBadDescriptor, b[10:12])
	}
	var out LegacyHandle
	out.Size = binary.LittleEndian.Uint64(b[12:])
	copy(out.Handle.Reserved[:], b[20:end])
	*h = out
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
	if !b.IsOwned() || b.Size() == 0 {
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is a view, borrowed or empty: export a whole cuMemAlloc allocation", b)
	}
	dev, err := b.Device()
	if err != nil {
		return LegacyHandle{}, err
	}
	var h cuda.IPCMemHandle
	// Held open: a concurrent Close cannot free the memory under the
	// driver calls.
	err = b.Use(op, func(ptr cuda.DevicePtr) error {
		// The driver exports whole allocations: a view would be mapped at
		// its allocation's base on the other side, with the wrong bytes.
		info, err := cuda.QueryPointer(ptr)
		if err != nil {
			return &cuda.OpError{Op: op, Err: err}
		}
		if info.RangeBase != ptr || info.RangeSize < b.Size() || info.Pool != 0 {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is not a whole cuMemAlloc allocation (use resource.SyncDevice; pool memory goes through ExportBuffer)", b)
		}
		if h, err = dev.IPCGetMemHandle(ptr); err != nil {
			return fmt.Errorf("%s %v: %w", op, b, err)
		}
		return nil
	})
	if err != nil {
		return LegacyHandle{}, err
	}
	return LegacyHandle{Handle: h, Size: b.Size()}, nil
}

// OpenLegacy maps memory another process exported with ExportLegacy. The
// returned buffer's Close unmaps it (cuIpcCloseMemHandle). A process cannot
// open its own handles. The handle's size is checked against the mapping
// the driver made: a handle claiming more than that is refused (and the
// mapping closed; the driver counts opens, so an earlier open of the same
// memory stays mapped).
//
// Unlike pool descriptors, legacy handles carry no key and cannot be
// authenticated: the 64 handle bytes go to cuIpcOpenMemHandle as
// received, and the driver parses them as it parses pool export data,
// without validating them. Open only handles from a sender this process
// trusts (see the package documentation's threat model).
func OpenLegacy(dev *cuda.Device, h LegacyHandle) (*buffer.Buffer, error) {
	const op = "ipc.OpenLegacy"
	if dev == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device")
	}
	if h.Size == 0 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "legacy handle of 0 bytes")
	}
	p, err := dev.IPCOpenMemHandle(h.Handle, cuda.IPCMemLazyEnablePeerAccess)
	if err != nil {
		return nil, fmt.Errorf("%s (%d bytes): %w", op, h.Size, err)
	}
	base, rangeSize, qerr := mappingOf(dev, p)
	if _, ok := within(p, h.Size, base, rangeSize); qerr != nil || !ok {
		var err error
		if qerr != nil {
			err = &cuda.OpError{Op: op, Err: fmt.Errorf("asking the driver for the mapping at %#x: %w", uint64(p), qerr)}
		} else {
			err = cuda.Errorf(op, cuda.ErrInvalidArgument, "legacy handle claims %d bytes, the driver mapped %d bytes at %#x (allocation %#x+%d)", h.Size, mappedFrom(p, base, rangeSize), uint64(p), uint64(base), rangeSize)
		}
		if cerr := dev.IPCCloseMemHandle(p); cerr != nil {
			err = errors.Join(err, fmt.Errorf("unmapping the refused handle: %w", cerr))
		}
		return nil, err
	}
	return buffer.Owned(p, h.Size, &legacyMapping{dev: dev}, dev.DefaultStream()), nil
}

// legacyMapping is the MemoryResource behind OpenLegacy's buffers: it only
// unmaps.
type legacyMapping struct{ dev *cuda.Device }

func (m *legacyMapping) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0, nil, cuda.Errorf("ipc.legacyMapping.Allocate", cuda.ErrInvalidArgument, "cannot allocate from memory opened with OpenLegacy")
}

// Deallocate waits for s (nil: the legacy default stream) and unmaps:
// cuIpcCloseMemHandle is not stream-ordered.
func (m *legacyMapping) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if m == nil || m.dev == nil {
		return cuda.Errorf("ipc.legacyMapping.Deallocate", cuda.ErrInvalidArgument, "nil or zero legacy mapping")
	}
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
func (m *legacyMapping) DeviceID() int {
	if m == nil || m.dev == nil {
		return -1
	}
	return m.dev.Ordinal()
}
