package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// LegacyHandle is memory shared through the driver's legacy IPC
// (cuIpcGetMemHandle), as CuPy, PyTorch and C programs share cudaMalloc
// memory: the allocation's 64 opaque bytes, where the shared range starts
// in the allocation and its size, with no file descriptor. ExportLegacy
// makes one, MarshalBinary encodes it for any channel, and OpenLegacy
// maps it. CuPy's and C's handles are Handle and Size (Offset 0). Pool
// memory uses ExportBuffer instead.
//
// torch.multiprocessing shares a CUDA tensor's storage this way:
// UntypedStorage._share_cuda_() returns the segment's handle, the
// storage's offset and size in bytes, the producer's reference-counter
// file and this share's counter in it (RefCounter, RefCounterOffset), and
// an interprocess event recorded after the work that made the tensor
// (Event, EventSync); NewTorchShare takes them all. With RefCounter set,
// closing the Buffer that OpenLegacy returns releases the share; without
// it the producer keeps the memory until it exits.
//
// Legacy handles carry no key and cannot be authenticated: take them only
// from a process this one trusts. A torch counter's name and index are
// still checked before anything is written.
type LegacyHandle struct {
	Handle cuda.IPCMemHandle // the allocation's (segment's) cudaIpcMemHandle_t
	Offset uint64            // where the shared range starts in the allocation
	Size   uint64            // the shared range's size in bytes
	// RefCounter is a torch producer's reference-counter file, a
	// shared-memory object named "/torch_<pid>_<number>" (empty: none);
	// RefCounterOffset is the index of this share's counter in it.
	RefCounter       string
	RefCounterOffset uint64
	// Event is a torch producer's interprocess event; OpenLegacy waits for
	// it when EventSync is set.
	Event     cuda.IPCEventHandle
	EventSync bool
}

// LegacyHandleSize is the length of an encoded LegacyHandle: magic (8),
// version (2), reserved (2), size (8), offset (8), handle (64), CRC-32 of
// everything before it (4).
const LegacyHandleSize = 8 + 2 + 2 + 8 + 8 + cuda.IPCHandleSize + 4

// legacyVersion 2 added the offset; version 1 handles are refused.
const legacyVersion = 2

var legacyMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'L'}

// MarshalBinary encodes h in a fixed, versioned, checksummed layout. A
// torch share (RefCounter or EventSync set) is refused with an error
// matching cuda.ErrInvalidArgument: its counter and event are torch's, and
// travel as torch's own tuple.
func (h LegacyHandle) MarshalBinary() ([]byte, error) {
	if h.RefCounter != "" || h.EventSync {
		return nil, cuda.Errorf("ipc.LegacyHandle.MarshalBinary", cuda.ErrInvalidArgument, "a torch share (reference counter %q, event sync %v) is not encoded: send torch's tuple", h.RefCounter, h.EventSync)
	}
	b := make([]byte, LegacyHandleSize)
	copy(b, legacyMagic[:])
	binary.LittleEndian.PutUint16(b[8:], legacyVersion)
	binary.LittleEndian.PutUint64(b[12:], h.Size)
	binary.LittleEndian.PutUint64(b[20:], h.Offset)
	copy(b[28:28+cuda.IPCHandleSize], h.Handle.Reserved[:])
	end := LegacyHandleSize - 4
	binary.LittleEndian.PutUint32(b[end:], checksum(b[:end]))
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced, rejecting anything
// else (length, magic, version, reserved bytes, checksum) with an error
// wrapping ErrBadDescriptor; h is left unchanged then. The checksum
// catches corruption, not lies: OpenLegacy bounds the size by the mapping.
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
	out.Offset = binary.LittleEndian.Uint64(b[20:])
	copy(out.Handle.Reserved[:], b[28:end])
	*h = out
	return nil
}

// NewTorchShare builds a LegacyHandle from everything _share_cuda_()
// returns but the device: the storage handle (bare, or versioned as newer
// torch sends it; expandable-segment handles are refused with an error
// matching cuda.ErrNotSupported), the storage's offset and size, the
// reference counter's file name and index, the event handle and whether to
// wait for it. The name must have torch's form, "/torch_<pid>_<number>"
// (an error matching cuda.ErrInvalidArgument otherwise), or be empty for a
// share without a counter. The event handle must have 64 bytes when
// eventSync is set (64 zero bytes or none otherwise).
func NewTorchShare(handle []byte, offset, size uint64, refCounter []byte, refCounterOffset uint64, event []byte, eventSync bool) (LegacyHandle, error) {
	const op = "ipc.NewTorchShare"
	if size == 0 {
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "size 0")
	}
	// A bare cudaIpcMemHandle_t, or a version byte (2 or 3), the type byte
	// 'c' (a cudaMalloc segment) and one; 'e' is an expandable segment.
	raw := handle
	switch {
	case len(handle) == cuda.IPCHandleSize:
	case len(handle) >= 2 && handle[1] == 'e':
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrNotSupported, "an expandable-segments storage handle (version %d, %d bytes) is not legacy IPC; share tensors allocated without expandable_segments", handle[0], len(handle))
	case len(handle) == 2+cuda.IPCHandleSize && handle[1] == 'c' && (handle[0] == 2 || handle[0] == 3):
		raw = handle[2:]
	case len(handle) >= 2 && handle[1] == 'c':
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "storage handle version %d of %d bytes: this library reads versions 2 and 3 of %d bytes", handle[0], len(handle), 2+cuda.IPCHandleSize)
	default:
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "storage handle of %d bytes: want a %d-byte cudaIpcMemHandle_t, or version, type 'c' and one (%d bytes)", len(handle), cuda.IPCHandleSize, 2+cuda.IPCHandleSize)
	}
	h := LegacyHandle{Offset: offset, Size: size}
	copy(h.Handle.Reserved[:], raw)
	name := string(refCounter)
	switch {
	case name == "" && refCounterOffset != 0:
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "reference counter %d of no counter file", refCounterOffset)
	case name != "":
		if err := checkTorchRef(op, name, refCounterOffset); err != nil {
			return LegacyHandle{}, err
		}
	}
	switch {
	case len(event) == cuda.IPCHandleSize:
		copy(h.Event.Reserved[:], event)
	case len(event) == 0 && !eventSync:
	default:
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "event handle of %d bytes (event_sync_required %v): want %d", len(event), eventSync, cuda.IPCHandleSize)
	}
	h.RefCounter, h.RefCounterOffset, h.EventSync = name, refCounterOffset, eventSync
	return h, nil
}

// OpenLegacy maps the range h describes (from ExportLegacy, CuPy's or a C
// program's cudaIpcGetMemHandle, or torch.multiprocessing) on dev and
// returns a Buffer of exactly its Offset..Offset+Size range. The Buffer
// owns only this process's mapping, which its Close unmaps (the driver
// counts opens). A handle claiming more than the allocation holds is
// refused (and the mapping closed). A process cannot open its own handles.
//
// With h.EventSync, OpenLegacy first waits for the producer's event. With
// h.RefCounter, it first opens and checks the producer's counter file, and
// the Buffer's Close, once its stream has finished and the memory is
// unmapped, decrements the counter, as torch's own consumer does. Opening
// one share twice releases it once, at the last Close. If the release
// fails, the Buffer is closed all the same and Close reports it, wrapping
// buffer.ErrPartlyFreed. When OpenLegacy fails, the share is left as it
// was: open it again, or give it up with ReleaseTorch.
//
// Without a reference counter, the exporter must keep the memory alive
// while the Buffer is open, and finish its work on it before sharing.
func OpenLegacy(dev *cuda.Device, h LegacyHandle) (*buffer.Buffer, error) {
	const op = "ipc.OpenLegacy"
	if dev == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device")
	}
	if h.Size == 0 || h.Offset > math.MaxUint64-h.Size {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "storage of %d bytes at offset %d", h.Size, h.Offset)
	}
	var ref *torchRef
	if h.RefCounter != "" {
		var err error
		if ref, err = acquireTorchRef(op, h.RefCounter, h.RefCounterOffset); err != nil {
			return nil, err
		}
	}
	// undo leaves the share as it was, for a retry or ReleaseTorch.
	undo := func(err error) (*buffer.Buffer, error) {
		if ref != nil {
			if derr := ref.release(false); derr != nil {
				err = errors.Join(err, derr)
			}
		}
		return nil, err
	}
	if h.EventSync {
		if err := dev.IPCWaitEvent(h.Event); err != nil {
			return undo(fmt.Errorf("%s (%d bytes at offset %d): waiting for the producer's event: %w", op, h.Size, h.Offset, err))
		}
	}
	base, err := dev.IPCOpenMemHandle(h.Handle, cuda.IPCMemLazyEnablePeerAccess)
	if err != nil {
		return undo(fmt.Errorf("%s (%d bytes at offset %d): %w", op, h.Size, h.Offset, err))
	}
	rbase, rsize, qerr := mappingOf(dev, base)
	start := base + cuda.DevicePtr(h.Offset)
	_, ok := within(start, h.Size, rbase, rsize)
	if qerr != nil || !ok || uint64(base) > math.MaxUint64-h.Offset {
		var err error
		if qerr != nil {
			err = &cuda.OpError{Op: op, Err: fmt.Errorf("asking the driver for the mapping at %#x: %w", uint64(base), qerr)}
		} else {
			err = cuda.Errorf(op, cuda.ErrInvalidArgument, "storage of %d bytes at offset %d does not fit the segment the driver mapped (%d bytes at %#x)", h.Size, h.Offset, mappedFrom(base, rbase, rsize), uint64(base))
		}
		if cerr := dev.IPCCloseMemHandle(base); cerr != nil {
			err = errors.Join(err, fmt.Errorf("unmapping the refused handle: %w", cerr))
		}
		return undo(err)
	}
	return buffer.Owned(start, h.Size, &legacyMapping{dev: dev, base: base, start: start, ref: ref}, dev.DefaultStream()), nil
}

// legacyMapping is the MemoryResource behind one OpenLegacy Buffer.
type legacyMapping struct {
	dev         *cuda.Device
	base, start cuda.DevicePtr
	ref         *torchRef // nil: no counter to release

	mu     sync.Mutex
	closed bool
}

func (m *legacyMapping) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0, nil, cuda.Errorf("ipc.legacyMapping.Allocate", cuda.ErrInvalidArgument, "cannot allocate from memory opened with OpenLegacy")
}

// Deallocate waits for s (nil: the legacy default stream) and unmaps the
// segment (cuIpcCloseMemHandle is not stream-ordered), then releases the
// share's reference counter.
func (m *legacyMapping) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "ipc.legacyMapping.Deallocate"
	if m == nil || m.dev == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil or zero mapping")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || p != m.start {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) is not the open storage of this mapping", uint64(p), size)
	}
	if s == nil {
		s = m.dev.DefaultStream()
	}
	if err := s.Sync(); err != nil {
		return err
	}
	if err := m.dev.IPCCloseMemHandle(m.base); err != nil {
		return err
	}
	m.closed = true
	if m.ref != nil {
		if err := m.ref.release(true); err != nil {
			return fmt.Errorf("%s %#x (%d bytes, unmapped): %w: %w", op, uint64(p), size, buffer.ErrPartlyFreed, err)
		}
	}
	return nil
}

func (m *legacyMapping) DeviceAccessible() bool { return true }
func (m *legacyMapping) HostAccessible() bool   { return false }
func (m *legacyMapping) DeviceID() int {
	if m == nil || m.dev == nil {
		return -1
	}
	return m.dev.Ordinal()
}

// ExportLegacy describes b, device memory from cuMemAlloc (a
// resource.SyncDevice buffer, a view of one, or such memory wrapped with
// buffer.FromPointer), the way CuPy and PyTorch share it: the
// allocation's legacy IPC handle, b's offset in it and its size. Another
// process maps it with OpenLegacy, or cuIpcOpenMemHandle plus Offset.
// Pool memory cannot be shared this way (use ExportBuffer).
func ExportLegacy(b *buffer.Buffer) (LegacyHandle, error) {
	const op = "ipc.ExportLegacy"
	if b == nil {
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	if b.IsClosed() {
		return LegacyHandle{}, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if b.Size() == 0 {
		return LegacyHandle{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "empty %v", b)
	}
	var h LegacyHandle
	err := b.Use(op, func(ptr cuda.DevicePtr) error {
		info, err := cuda.QueryPointer(ptr)
		if err != nil {
			return &cuda.OpError{Op: op, Err: err}
		}
		if info.Type != cuda.MemoryTypeDevice || info.Managed || info.Pool != 0 {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is not cuMemAlloc device memory (use resource.SyncDevice; pool memory goes through ExportBuffer)", b)
		}
		if _, ok := within(ptr, b.Size(), info.RangeBase, info.RangeSize); !ok {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v runs past its allocation (%#x+%d)", b, uint64(info.RangeBase), info.RangeSize)
		}
		dev, err := cuda.GetDevice(info.Device)
		if err != nil {
			return err
		}
		if h.Handle, err = dev.IPCGetMemHandle(info.RangeBase); err != nil {
			return fmt.Errorf("%s %v: %w", op, b, err)
		}
		h.Offset, h.Size = uint64(ptr-info.RangeBase), b.Size()
		return nil
	})
	if err != nil {
		return LegacyHandle{}, err
	}
	return h, nil
}
