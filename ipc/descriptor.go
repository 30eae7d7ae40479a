package ipc

import (
	"encoding/binary"
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// Descriptor describes one buffer of an exported pool: plain bytes, safe to
// send any way (a pipe, a socket, a file) to a process that imported the
// pool. It holds no file descriptor, no pointer and no key.
type Descriptor struct {
	Pool UUID                      // the exporting pool
	Size uint64                    // the buffer's size in bytes
	Data cuda.MemPoolPtrExportData // the driver's opaque export data
	// MAC authenticates every other field under the pool's key: ExportBuffer
	// sets it, and ImportedPool.Import checks it before the driver sees
	// the export data.
	MAC [MACSize]byte
}

// descriptorMagic starts every encoded descriptor.
var descriptorMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'D'}

const (
	// descriptorVersion 2 added the MAC; version 1 descriptors are refused.
	descriptorVersion = 2
	// descriptorBody is the length of the part the MAC covers: magic (8),
	// version (2), reserved (2), size (8), pool UUID (16), export data
	// (64).
	descriptorBody = 8 + 2 + 2 + 8 + 16 + 64
	// DescriptorSize is the length of an encoded Descriptor: the body,
	// its MAC (16), and a CRC-32 of everything before it (4).
	DescriptorSize = descriptorBody + MACSize + 4
	descriptorCRC  = descriptorBody + MACSize // offset of the CRC
)

// ErrBadDescriptor is wrapped by every decoding failure, and by every
// refusal of a descriptor by ImportedPool.Import (whichever field is
// wrong: pool, size, export data or MAC) and ImportUnauthenticated. It
// matches cuda.ErrInvalidArgument too.
var ErrBadDescriptor = fmt.Errorf("ipc: bad buffer descriptor (%w)", cuda.ErrInvalidArgument)

// body encodes what the MAC covers.
func (d Descriptor) body() [descriptorBody]byte {
	var b [descriptorBody]byte
	copy(b[:], descriptorMagic[:])
	binary.LittleEndian.PutUint16(b[8:], descriptorVersion)
	binary.LittleEndian.PutUint64(b[12:], d.Size)
	copy(b[20:36], d.Pool[:])
	copy(b[36:100], d.Data.Reserved[:])
	return b
}

// MarshalBinary encodes d in a fixed, versioned, checksummed layout.
func (d Descriptor) MarshalBinary() ([]byte, error) {
	b := make([]byte, DescriptorSize)
	body := d.body()
	copy(b, body[:])
	copy(b[descriptorBody:], d.MAC[:])
	binary.LittleEndian.PutUint32(b[descriptorCRC:], checksum(b[:descriptorCRC]))
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary produced. Anything else —
// wrong length, magic, version, reserved bytes or checksum — is rejected
// with an error wrapping ErrBadDescriptor, and d is left unchanged.
// Decoding cannot check the MAC (it needs the pool's key):
// ImportedPool.Import does.
func (d *Descriptor) UnmarshalBinary(b []byte) error {
	switch {
	case d == nil:
		return cuda.Errorf("ipc.Descriptor.UnmarshalBinary", cuda.ErrInvalidArgument, "nil *Descriptor")
	case len(b) != DescriptorSize:
		return fmt.Errorf("%w: %d bytes, want %d", ErrBadDescriptor, len(b), DescriptorSize)
	case [8]byte(b[:8]) != descriptorMagic:
		return fmt.Errorf("%w: not a cudamem descriptor (magic %q)", ErrBadDescriptor, b[:8])
	case binary.LittleEndian.Uint16(b[8:]) != descriptorVersion:
		return fmt.Errorf("%w: version %d, this library reads %d", ErrBadDescriptor, binary.LittleEndian.Uint16(b[8:]), descriptorVersion)
	case binary.LittleEndian.Uint32(b[descriptorCRC:]) != checksum(b[:descriptorCRC]):
		return fmt.Errorf("%w: checksum mismatch (corrupted in transit?)", ErrBadDescriptor)
	case b[10] != 0 || b[11] != 0:
		return fmt.Errorf("%w: reserved bytes % x are not zero", ErrBadDescriptor, b[10:12])
	}
	var out Descriptor
	out.Size = binary.LittleEndian.Uint64(b[12:])
	copy(out.Pool[:], b[20:36])
	copy(out.Data.Reserved[:], b[36:100])
	copy(out.MAC[:], b[descriptorBody:descriptorCRC])
	*d = out
	return nil
}
