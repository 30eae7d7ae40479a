package virtual

import (
	"fmt"
	"os"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Chunk is one exported physical allocation: a file descriptor another
// process imports, and its size. An allocation exports as one Chunk per
// physical piece, in address order.
type Chunk struct {
	FD   int
	Size uint64
}

// CloseChunks closes the chunks' file descriptors.
func CloseChunks(chunks []Chunk) {
	for _, c := range chunks {
		if c.FD >= 0 {
			os.NewFile(uintptr(c.FD), "cudamem-vmm").Close()
		}
	}
}

// Export exports b's physical memory as POSIX file descriptors (the
// resource's HandleType must allow it). The caller owns the fds: send them
// (package ipc) and close them with CloseChunks.
func (r *Resource) Export(b *buffer.Buffer) ([]Chunk, error) {
	a, _, err := r.take("virtual.Export", b)
	if err != nil {
		return nil, err
	}
	if r.prop.RequestedHandleTypes&cuda.MemHandleTypePosixFileDescriptor == 0 {
		return nil, cuda.Errorf("virtual.Export", cuda.ErrInvalidArgument, "resource was created without POSIX fd handles (HandleType)")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Chunk, 0, len(a.chunks))
	for _, c := range a.chunks {
		fd, err := r.dev.MemExportFD(c.h)
		if err != nil {
			CloseChunks(out)
			return nil, fmt.Errorf("virtual.Export %#x: %w", uint64(a.base), err)
		}
		out = append(out, Chunk{FD: fd, Size: c.size})
	}
	return out, nil
}

// Import maps chunks exported by another process (in order, back to back)
// into a new allocation of this resource, with this resource's access
// settings, and returns a buffer of size bytes (at most their total). The
// fds stay the caller's to close. Closing the buffer unmaps the memory
// and releases the imported handles; the exporter's memory lives on.
func (r *Resource) Import(chunks []Chunk, size uint64) (*buffer.Buffer, error) {
	if err := r.check("virtual.Import"); err != nil {
		return nil, err
	}
	var total uint64
	for i, c := range chunks {
		if c.FD < 0 || c.Size == 0 || c.Size%r.gran != 0 {
			return nil, cuda.Errorf("virtual.Import", cuda.ErrInvalidArgument, "chunk %d: fd %d, size %d (must be a positive multiple of %d)", i, c.FD, c.Size, r.gran)
		}
		total += c.Size
	}
	if len(chunks) == 0 || size == 0 || size > total {
		return nil, cuda.Errorf("virtual.Import", cuda.ErrInvalidArgument, "size %d with %d chunks of %d bytes in all", size, len(chunks), total)
	}
	var u undo
	ptr, err := r.dev.MemAddressReserve(total, r.align, 0)
	if err != nil {
		return nil, err
	}
	u.add(func() { r.dev.MemAddressFree(ptr, total) })
	descs := append([]cuda.MemAccessDesc(nil), r.descs...)
	a := &allocation{base: ptr, size: size, reservations: []span{{ptr, total}}, descs: descs}
	for i, c := range chunks {
		h, err := r.dev.MemImportFD(c.FD)
		if err != nil {
			u.run()
			return nil, fmt.Errorf("virtual.Import chunk %d: %w", i, err)
		}
		u.add(func() { r.dev.MemRelease(h) })
		at := ptr + cuda.DevicePtr(a.mapped)
		if err := r.dev.MemMap(at, c.Size, 0, h); err != nil {
			u.run()
			return nil, fmt.Errorf("virtual.Import chunk %d: %w", i, err)
		}
		u.add(func() { r.dev.MemUnmap(at, c.Size) })
		a.chunks = append(a.chunks, chunk{off: a.mapped, size: c.Size, h: h})
		a.mapped += c.Size
	}
	if err := r.dev.MemSetAccess(ptr, total, descs...); err != nil {
		u.run()
		return nil, fmt.Errorf("virtual.Import: %w", err)
	}
	r.mu.Lock()
	r.allocs[ptr] = a
	r.mu.Unlock()
	return buffer.Owned(ptr, size, r, nil), nil
}
