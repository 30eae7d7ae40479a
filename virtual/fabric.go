package virtual

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// FabricChunk is one physical allocation exported as a fabric handle, and
// its size. Unlike a Chunk it holds no OS resource: it is plain bytes
// (MarshalBinary) that any channel can carry to a process on another node
// of the NVLink domain, and there is nothing to close.
type FabricChunk struct {
	Handle cuda.MemFabricHandle
	Size   uint64
}

// fabricChunkMagic starts every encoded FabricChunk.
var fabricChunkMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'F'}

const (
	fabricChunkVersion = 1
	// FabricChunkSize is the length of an encoded FabricChunk: magic (8),
	// version (2), reserved (2), size (8), the fabric handle (64) and a
	// CRC-32 (IEEE) of everything before it (4).
	FabricChunkSize = 8 + 2 + 2 + 8 + cuda.IPCHandleSize + 4
	fabricChunkCRC  = FabricChunkSize - 4
)

// MarshalBinary encodes c in a fixed, versioned, checksummed layout. A
// chunk with a zero size or handle (which no export makes) is refused.
func (c FabricChunk) MarshalBinary() ([]byte, error) {
	if c.Size == 0 || c.Handle.IsZero() {
		return nil, cuda.Errorf("virtual.FabricChunk.MarshalBinary", cuda.ErrInvalidArgument, "size %d, %v: not an exported chunk", c.Size, c.Handle)
	}
	b := make([]byte, FabricChunkSize)
	copy(b, fabricChunkMagic[:])
	binary.LittleEndian.PutUint16(b[8:], fabricChunkVersion)
	binary.LittleEndian.PutUint64(b[12:], c.Size)
	copy(b[20:20+cuda.IPCHandleSize], c.Handle.Data[:])
	binary.LittleEndian.PutUint32(b[fabricChunkCRC:], crc32.ChecksumIEEE(b[:fabricChunkCRC]))
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced. Anything else (wrong
// length, magic, version, reserved bytes or checksum; a zero size or
// handle) is refused with an error matching cuda.ErrInvalidArgument, and c
// is left unchanged. The checksum catches corruption, not lies: the
// importing driver decides whether the handle is real (ImportFabric).
func (c *FabricChunk) UnmarshalBinary(b []byte) error {
	const op = "virtual.FabricChunk.UnmarshalBinary"
	bad := func(format string, args ...any) error {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, format, args...)
	}
	switch {
	case c == nil:
		return bad("nil *FabricChunk")
	case len(b) != FabricChunkSize:
		return bad("%d bytes, want %d", len(b), FabricChunkSize)
	case [8]byte(b[:8]) != fabricChunkMagic:
		return bad("not a cudamem fabric chunk (magic %q)", b[:8])
	case binary.LittleEndian.Uint16(b[8:]) != fabricChunkVersion:
		return bad("version %d, this library reads %d", binary.LittleEndian.Uint16(b[8:]), fabricChunkVersion)
	case binary.LittleEndian.Uint32(b[fabricChunkCRC:]) != crc32.ChecksumIEEE(b[:fabricChunkCRC]):
		return bad("checksum mismatch (corrupted in transit?)")
	case b[10] != 0 || b[11] != 0:
		return bad("reserved bytes % x are not zero", b[10:12])
	}
	var out FabricChunk
	out.Size = binary.LittleEndian.Uint64(b[12:])
	copy(out.Handle.Data[:], b[20:20+cuda.IPCHandleSize])
	if out.Size == 0 || out.Handle.IsZero() {
		return bad("size %d, %v: an export makes neither a zero size nor a zero handle", out.Size, out.Handle)
	}
	*c = out
	return nil
}

// String describes the chunk without the handle's bytes.
func (c FabricChunk) String() string {
	return fmt.Sprintf("FabricChunk(%v, %d bytes)", c.Handle, c.Size)
}

// ExportFabric exports b's physical memory as fabric handles, one per
// physical chunk in address order, for a process on this node or another
// of the same multi-node NVLink domain to map with ImportFabric. The
// resource's HandleType must include fabric handles. Without the IMEX
// service the error matches cuda.ErrNotSupported and names IMEX. Nothing
// needs closing: the memory lives while b is open here (importers keep
// their mappings alive on their side), so free b only once importers are
// done with it.
func (r *Resource) ExportFabric(b *buffer.Buffer) ([]FabricChunk, error) {
	const op = "Resource.ExportFabric"
	var out []FabricChunk
	err := r.withLive(op, b, func(a *allocation) error {
		if r.prop.RequestedHandleTypes&cuda.MemHandleTypeFabric == 0 {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "resource was created without fabric handles (HandleType %d; want HandleFabric or HandlePosixFDAndFabric)", int(r.opts.HandleType))
		}
		out = make([]FabricChunk, 0, len(a.chunks))
		for i, c := range a.chunks {
			fh, err := r.drv.MemExportFabric(c.h)
			if err != nil {
				out = nil
				return fmt.Errorf("%s %#x chunk %d: %w", op, uint64(a.base), i, cuda.FabricError(op, err))
			}
			out = append(out, FabricChunk{Handle: fh, Size: c.size})
		}
		a.shared = "exported"
		return nil
	})
	return out, err
}

// ImportFabric maps chunks another process exported with ExportFabric (in
// order, back to back) into a new allocation of this resource, and returns
// a buffer of size bytes (at most their total), as Import does for fds and
// under the same checks of hostile input: the list is checked whole
// before the driver sees it; the driver refuses handles it did not make,
// and maps no more than a physical allocation holds (a larger claimed size
// is refused); the memory's properties are read back and checked; on
// error nothing stays reserved, mapped or imported. Without IMEX the error
// matches cuda.ErrNotSupported and names it.
func (r *Resource) ImportFabric(chunks []FabricChunk, size uint64) (*buffer.Buffer, error) {
	const op = "virtual.ImportFabric"
	if err := r.check(op); err != nil {
		return nil, err
	}
	total, err := checkChunkList(op, len(chunks), size, r.gran, "a non-zero handle",
		func(i int) (uint64, bool) { return chunks[i].Size, !chunks[i].Handle.IsZero() },
		func(i int) string { return chunks[i].Handle.String() })
	if err != nil {
		return nil, err
	}
	return r.importChunks(op, len(chunks), total, size, func(i int) (cuda.MemHandle, uint64, error) {
		c := chunks[i]
		h, err := r.drv.MemImportFabric(&c.Handle)
		if err != nil {
			return 0, 0, cuda.FabricError(op, err)
		}
		return h, c.Size, r.checkImported(op, h, c.Handle.String())
	})
}
