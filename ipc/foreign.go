package ipc

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"

	"github.com/cudamem/cudamem/cuda"
)

// ExportData returns a copy of d's 64 bytes of export data: what cuda.core
// takes as IPCBufferDescriptor._init(data, size), what a C importer passes
// to cuMemPoolImportPointer, and what ImportUnauthenticated takes.
func (d Descriptor) ExportData() []byte { return bytes.Clone(d.Data.Reserved[:]) }

// PoolErr is Pool with an error: the imported driver pool, or an error
// matching cuda.ErrClosed once p is closed (cuda.ErrInvalidArgument for a
// nil or zero pool).
func (p *ImportedPool) PoolErr() (cuda.MemPool, error) {
	if err := p.checkOpen("ImportedPool.PoolErr"); err != nil {
		return cuda.MemPool{}, err
	}
	return p.pool, nil
}

// identityUUID turns a file's identity (device and inode numbers) into a
// UUID (version 8, name-based on SHA-256), so that equal files give equal
// UUIDs and the registry dedups them.
func identityUUID(dev, ino uint64) UUID {
	var b [8 + 8 + 16]byte
	copy(b[:16], "cudamem fd ident")
	binary.LittleEndian.PutUint64(b[16:], dev)
	binary.LittleEndian.PutUint64(b[24:], ino)
	sum := sha256.Sum256(b[:])
	var u UUID
	copy(u[:], sum[:16])
	u[6] = u[6]&0x0f | 0x80
	u[8] = u[8]&0x3f | 0x80
	return u
}

// NewForeignHandle takes ownership of fd, a pool exported by a library
// that sends no UUID with it (a bare fd from CuPy or a C program;
// cuda.core's IPCAllocationHandle has one: give it to NewHandle instead).
// The Handle's UUID is derived from the fd's file (its device and inode
// numbers) where that identifies the pool, so the registry maps one pool
// once however many such fds arrive (descriptors of one open file: dup'd,
// sent over SCM_RIGHTS, inherited); otherwise (a device node or an
// anonymous inode, whose inode unrelated files share, or a system other
// than Linux) it is a fresh random UUID, and derived is false. Then
// importing two such Handles of one pool maps it twice, and either
// ImportedPool's Close unmaps what the other's Buffers use: import a pool
// from one such Handle only, or have the exporter send a UUID and use
// NewHandle. The Handle has no key: its pool takes buffers only through
// ImportUnauthenticated.
func NewForeignHandle(fd int) (h *Handle, derived bool, err error) {
	const op = "ipc.NewForeignHandle"
	if fd < 0 {
		return nil, false, cuda.Errorf(op, cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	u, err := fdIdentity(fd)
	switch {
	case err == nil:
		derived = true
	case errors.Is(err, cuda.ErrNotSupported):
		u = cuda.NewUUID()
	default:
		return nil, false, err
	}
	h, err = newHandle(op, fd, u, poolKey{})
	if err != nil {
		return nil, false, err
	}
	return h, derived, nil
}
