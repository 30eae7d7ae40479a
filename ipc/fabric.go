package ipc

import (
	"encoding/binary"
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// FabricHandle is a pool exported as a fabric handle
// (CU_MEM_HANDLE_TYPE_FABRIC), for processes on any node of a multi-node
// NVLink domain: the driver's 64-byte handle, the pool's UUID and, for
// pools exported by this package, the pool's key. It holds no file
// descriptor: MarshalBinary makes plain bytes for any channel, and
// ImportPoolFabric maps the pool on the other side. Buffers then travel as
// Descriptors, as for fd-exported pools.
//
// The encoding carries the pool key, as a Handle's Token does: send it
// only to processes you would trust with the pool, over a channel others
// cannot read.
type FabricHandle struct {
	uuid UUID
	key  poolKey
	h    fabricBytes
}

// fabricBytes holds a driver fabric handle as a string behind a pointer:
// as with poolKey, fmt printing a value that holds one shows an address,
// not the bytes. The zero fabricBytes is the zero handle.
type fabricBytes struct {
	s *string
}

func sealFabric(h cuda.MemFabricHandle) fabricBytes {
	if h.IsZero() {
		return fabricBytes{}
	}
	s := string(h.Data[:])
	return fabricBytes{s: &s}
}

func (f fabricBytes) get() cuda.MemFabricHandle {
	var h cuda.MemFabricHandle
	if f.s != nil {
		copy(h.Data[:], *f.s)
	}
	return h
}

func (f fabricBytes) IsZero() bool { return f.s == nil }

// fabricMagic starts every encoded FabricHandle.
var fabricMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'P'}

const (
	fabricVersion = 1
	// FabricHandleSize is the length of an encoded FabricHandle: magic
	// (8), version (2), flags (2: bit 0 set when a key follows), pool UUID
	// (16), pool key (32, zero without one), the driver's fabric handle
	// (64) and a CRC-32 of everything before it (4).
	FabricHandleSize = 8 + 2 + 2 + 16 + keySize + cuda.IPCHandleSize + 4
	fabricCRC        = FabricHandleSize - 4
	fabricHasKey     = 1
)

// ErrBadFabricHandle is wrapped by every refusal to decode a FabricHandle.
// It matches cuda.ErrInvalidArgument too.
var ErrBadFabricHandle = fmt.Errorf("ipc: bad fabric handle (%w)", cuda.ErrInvalidArgument)

// UUID names the exported pool.
func (h *FabricHandle) UUID() UUID {
	if h == nil {
		return UUID{}
	}
	return h.uuid
}

// HasKey reports whether the handle carries the pool's key (it does when
// ExportPoolFabric made it), so its pool's descriptors are authenticated.
func (h *FabricHandle) HasKey() bool { return h != nil && h.key.has() }

// Fabric returns the driver's fabric handle, as cuda.core or a C program
// importing the pool would take it (cuMemPoolImportFromShareableHandle with
// CU_MEM_HANDLE_TYPE_FABRIC).
func (h *FabricHandle) Fabric() cuda.MemFabricHandle {
	if h == nil {
		return cuda.MemFabricHandle{}
	}
	return h.h.get()
}

func (h *FabricHandle) zero() bool { return h == nil || h.h.IsZero() || h.uuid == (UUID{}) }

// String describes the handle without its secrets (the key, the driver's
// bytes).
func (h *FabricHandle) String() string {
	if h.zero() {
		return "FabricHandle(zero)"
	}
	return fmt.Sprintf("FabricHandle(pool %v, %v, key %v)", h.uuid, h.h.get(), h.key.has())
}

// MarshalBinary encodes h in a fixed, versioned, checksummed layout of
// FabricHandleSize bytes. The zero FabricHandle is refused.
func (h *FabricHandle) MarshalBinary() ([]byte, error) {
	if h.zero() {
		return nil, cuda.Errorf("ipc.FabricHandle.MarshalBinary", cuda.ErrInvalidArgument, "nil or zero *FabricHandle (use ExportPoolFabric)")
	}
	b := make([]byte, FabricHandleSize)
	copy(b, fabricMagic[:])
	binary.LittleEndian.PutUint16(b[8:], fabricVersion)
	if h.key.has() {
		binary.LittleEndian.PutUint16(b[10:], fabricHasKey)
		copy(b[28:28+keySize], *h.key.k)
	}
	copy(b[12:28], h.uuid[:])
	fh := h.h.get()
	copy(b[28+keySize:fabricCRC], fh.Data[:])
	binary.LittleEndian.PutUint32(b[fabricCRC:], checksum(b[:fabricCRC]))
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced. Anything else
// (wrong length, magic, version, flags or checksum; the zero UUID or
// fabric handle; key bytes without the key flag) is refused with an error
// wrapping ErrBadFabricHandle, and h is left unchanged. The driver decides
// whether the fabric handle is real (ImportPoolFabric).
func (h *FabricHandle) UnmarshalBinary(b []byte) error {
	if h == nil {
		return cuda.Errorf("ipc.FabricHandle.UnmarshalBinary", cuda.ErrInvalidArgument, "nil *FabricHandle")
	}
	switch {
	case len(b) != FabricHandleSize:
		return fmt.Errorf("%w: %d bytes, want %d", ErrBadFabricHandle, len(b), FabricHandleSize)
	case [8]byte(b[:8]) != fabricMagic:
		return fmt.Errorf("%w: not a cudamem fabric handle (magic %q)", ErrBadFabricHandle, b[:8])
	case binary.LittleEndian.Uint16(b[8:]) != fabricVersion:
		return fmt.Errorf("%w: version %d, this library reads %d", ErrBadFabricHandle, binary.LittleEndian.Uint16(b[8:]), fabricVersion)
	case binary.LittleEndian.Uint32(b[fabricCRC:]) != checksum(b[:fabricCRC]):
		return fmt.Errorf("%w: checksum mismatch (corrupted in transit?)", ErrBadFabricHandle)
	}
	flags := binary.LittleEndian.Uint16(b[10:])
	var out FabricHandle
	copy(out.uuid[:], b[12:28])
	var fh cuda.MemFabricHandle
	copy(fh.Data[:], b[28+keySize:fabricCRC])
	out.h = sealFabric(fh)
	keyBytes := b[28 : 28+keySize]
	switch {
	case flags&^fabricHasKey != 0:
		return fmt.Errorf("%w: unknown flags %#x", ErrBadFabricHandle, flags)
	case flags == 0 && [keySize]byte(keyBytes) != [keySize]byte{}:
		return fmt.Errorf("%w: key bytes present but the key flag is not set", ErrBadFabricHandle)
	case out.uuid == (UUID{}):
		return fmt.Errorf("%w: zero pool UUID (imports are deduplicated by UUID)", ErrBadFabricHandle)
	case out.h.IsZero():
		return fmt.Errorf("%w: all-zero driver handle", ErrBadFabricHandle)
	}
	if flags&fabricHasKey != 0 {
		out.key = keyFrom(keyBytes)
	}
	*h = out
	return nil
}

// handleTypes returns the handle types p was created with: what it
// reports (resource.DevicePool), else POSIX fds (the only type this
// module's other IPC pools take).
func handleTypes(p ExportablePool) cuda.MemHandleType {
	if ht, ok := p.(interface{ HandleTypes() cuda.MemHandleType }); ok {
		return ht.HandleTypes()
	}
	return cuda.MemHandleTypePosixFileDescriptor
}

// ExportPoolFabric exports a pool created with fabric handles
// (resource.DevicePoolOptions.Fabric) as a FabricHandle, carrying the same
// UUID and key as every ExportPool of the pool, for a process on any node
// of the NVLink domain. An imported pool that came from a FabricHandle is
// exported again with the same handle (A to B to C). Without IMEX the
// error matches cuda.ErrNotSupported and names it.
func ExportPoolFabric(p ExportablePool) (*FabricHandle, error) {
	const op = "ipc.ExportPoolFabric"
	if ip, ok := p.(*ImportedPool); ok {
		return ip.exportFabric()
	}
	var out *FabricHandle
	err := exportPool(op, p, cuda.MemHandleTypeFabric, "fabric handles (resource.DevicePoolOptions.Fabric)", func(pool cuda.MemPool, st *exportState) error {
		fh, err := pool.ExportFabric()
		if err != nil {
			return &cuda.OpError{Op: op, Err: err}
		}
		st.markExported()
		out = &FabricHandle{uuid: st.uuid, key: st.key, h: sealFabric(fh)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ImportPoolFabric maps the pool h describes on dev, as ImportPool does for
// a Handle and with the same checks (the same UUID under another key, on
// another device, or closed here but not yet destroyed is refused). The
// fabric handle is hostile input: the driver refuses handles it did not
// make, and without IMEX the error matches cuda.ErrNotSupported and names
// it.
func ImportPoolFabric(dev *cuda.Device, h *FabricHandle) (*ImportedPool, error) {
	const op = "ipc.ImportPoolFabric"
	if dev == nil || h.zero() {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device, or nil or zero *FabricHandle")
	}
	u, k, fb := h.uuid, h.key, h.h
	return importOnce(op, dev, u, k, func() (*ImportedPool, error) {
		fh := fb.get()
		pool, err := dev.ImportMemPoolFabric(&fh)
		if err != nil {
			return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("pool %v: %w", u, err)}
		}
		p := newImportedPool(dev, pool, cudaImport{dev: dev, pool: pool}, u, k, nil)
		p.fabric = fb
		return p, nil
	})
}

// exportFabric is ExportPoolFabric of an imported pool: the FabricHandle
// it was imported from.
func (p *ImportedPool) exportFabric() (*FabricHandle, error) {
	const op = "ipc.ExportPoolFabric"
	if err := p.enter(op); err != nil {
		return nil, err
	}
	defer p.life.Leave()
	if p.fabric.IsZero() {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "pool %v was imported from a file descriptor, not a fabric handle (use ExportPool)", p.uuid)
	}
	return &FabricHandle{uuid: p.uuid, key: p.key, h: p.fabric}, nil
}
