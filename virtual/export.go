package virtual

import (
	"errors"
	"fmt"
	"math"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
)

// Chunk is one exported physical allocation: a file descriptor another
// process imports, and its size. An allocation exports as one Chunk per
// physical piece, in address order.
type Chunk struct {
	FD   int
	Size uint64
}

// CloseChunkFDs closes the chunks' file descriptors and returns every
// failure, joined. Chunks with a negative fd or a size of 0 (the zero
// Chunk: no export makes one) are skipped, so a zero Chunk never closes
// fd 0.
func CloseChunkFDs(chunks []Chunk) error {
	var errs []error
	for i, c := range chunks {
		if c.FD < 0 || c.Size == 0 {
			continue
		}
		if err := osfd.Close(c.FD); err != nil {
			errs = append(errs, fmt.Errorf("chunk %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Export exports b's physical memory as POSIX file descriptors (the
// resource's HandleType must allow it), one Chunk per physical chunk. The
// caller owns the fds, which are close-on-exec (hand them to a child
// through exec.Cmd.ExtraFiles or over a socket with package ipc), and
// closes them with CloseChunkFDs. On error no fd is left open. b is held
// open while its chunks are exported: a concurrent Close waits for the
// export, and a buffer closed before it (or consumed by Grow or Shrink)
// gives an error matching cuda.ErrClosed.
func (r *Resource) Export(b *buffer.Buffer) ([]Chunk, error) {
	const op = "Resource.Export"
	var out []Chunk
	err := r.withLive(op, b, func(a *allocation) error {
		if r.prop.RequestedHandleTypes&cuda.MemHandleTypePosixFileDescriptor == 0 {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "resource was created without POSIX fd handles (HandleType)")
		}
		var err error
		if out, err = r.exportFDs(op, a); err == nil {
			a.shared = "exported"
		}
		return err
	})
	return out, err
}

// exportFDs exports a's chunks as fds, in order, each checked open and
// made close-on-exec (osfd.New). Called with r.mu held and a live
// (useLive). On error no fd is left open.
func (r *Resource) exportFDs(op string, a *allocation) ([]Chunk, error) {
	out := make([]Chunk, 0, len(a.chunks))
	for i, c := range a.chunks {
		fd, err := r.drv.MemExportFD(c.h)
		if err == nil {
			fd, err = adoptFD(fd)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%s %#x chunk %d: %w", op, uint64(a.base), i, err), CloseChunkFDs(out))
		}
		out = append(out, Chunk{FD: fd, Size: c.size})
	}
	return out, nil
}

// adoptFD checks that the driver's fd is open and sets close-on-exec on
// it, closing it if that fails.
func adoptFD(fd int) (int, error) {
	f, err := osfd.New(fd)
	if err != nil {
		return -1, errors.Join(err, osfd.Close(fd))
	}
	return f.Release()
}

// checkChunks is checkChunkList for fds.
func checkChunks(chunks []Chunk, size, gran uint64) (uint64, error) {
	return checkChunkList("virtual.Import", len(chunks), size, gran, "a valid fd",
		func(i int) (uint64, bool) { return chunks[i].Size, chunks[i].FD >= 0 },
		func(i int) string { return fmt.Sprintf("fd %d", chunks[i].FD) })
}

// checkChunkList validates n chunks received from another process before
// any driver call: at least one chunk, each with a valid handle and a
// positive multiple of gran, sizes that add up without passing 2^64, and
// a buffer size of 1 to their total bytes. chunk(i) gives chunk i's size
// and whether its handle is valid, name(i) names it in an error (valid
// says what a good handle is). It returns the total.
func checkChunkList(op string, n int, size, gran uint64, valid string, chunk func(i int) (uint64, bool), name func(i int) string) (uint64, error) {
	if gran == 0 {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "granularity 0")
	}
	if n == 0 {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "no chunks (size %d)", size)
	}
	var total uint64
	for i := range n {
		sz, ok := chunk(i)
		if !ok || sz == 0 || sz%gran != 0 {
			return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "chunk %d: %s, size %d (want %s and a positive multiple of %d)", i, name(i), sz, valid, gran)
		}
		if sz > math.MaxUint64-total {
			return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "chunk %d: size %d brings the total past 2^64 (%d bytes before it)", i, sz, total)
		}
		total += sz
	}
	if size == 0 || size > total {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "size %d with %d chunks of %d bytes in all (want 1 to %d)", size, n, total, total)
	}
	return total, nil
}

// Import maps chunks exported by another process (in order, back to back)
// into a new allocation of this resource, with this resource's access
// settings, and returns a buffer of size bytes (at most their total). The
// fds stay the caller's to close. Closing the buffer unmaps the memory
// and releases the imported handles; the exporter's memory lives on.
//
// The chunks are hostile input. The list is checked whole before the
// driver sees it, each fd's kind included: one the driver's export never
// is (a pipe, socket, regular file...) is refused with an error matching
// cuda.ErrInvalidArgument, as by ipc.ImportPool. Each imported handle's
// properties are then read back from the driver: memory that is not VMM
// memory, or that lives on the host when this resource is device memory
// (or the reverse), is refused. On error nothing stays reserved, mapped
// or imported.
func (r *Resource) Import(chunks []Chunk, size uint64) (*buffer.Buffer, error) {
	const op = "virtual.Import"
	if err := r.check(op); err != nil {
		return nil, err
	}
	total, err := checkChunks(chunks, size, r.gran)
	if err != nil {
		return nil, err
	}
	for i, c := range chunks {
		if err := osfd.CheckExport(op, c.FD, fmt.Sprintf("chunk %d of a VMM allocation", i)); err != nil {
			return nil, err
		}
	}
	return r.importChunks(op, len(chunks), total, size, func(i int) (cuda.MemHandle, uint64, error) {
		c := chunks[i]
		h, err := r.drv.MemImportFD(c.FD)
		if err != nil {
			return 0, 0, err
		}
		return h, c.Size, r.checkImported(op, h, fmt.Sprintf("fd %d", c.FD))
	})
}

// checkImported refuses an imported handle (named by what) whose memory,
// as the driver reports it, this resource cannot stand for: not VMM
// memory, or on the host when the resource is device memory (or the
// reverse). The sender's word on where the memory lives is not taken:
// host memory mapped into a device resource (or the reverse) would make
// the resource misreport what its buffers are.
func (r *Resource) checkImported(op string, h cuda.MemHandle, what string) error {
	prop, err := r.drv.MemAllocationProperties(h)
	if err != nil {
		return fmt.Errorf("reading the properties of the memory imported from %s: %w", what, err)
	}
	if prop.Type != cuda.MemAllocationTypePinned && prop.Type != cuda.MemAllocationTypeManaged {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s imports memory of allocation type %d: not VMM memory", what, prop.Type)
	}
	if onDev := prop.Location.Type == cuda.MemLocationTypeDevice; onDev != (r.opts.Location == OnDevice) {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s imports memory located at %v, but this resource's Location is %d", what, prop.Location, int(r.opts.Location))
	}
	return nil
}

// importChunks maps n imported physical chunks back to back into a new
// reservation of total bytes and returns a buffer of size bytes over them.
// open imports chunk i and returns its handle and size; a handle it
// returns with an error is released here. On error nothing stays
// reserved, mapped or imported.
func (r *Resource) importChunks(op string, n int, total, size uint64, open func(i int) (cuda.MemHandle, uint64, error)) (*buffer.Buffer, error) {
	r.retryLeftovers()
	var t txn
	t.start()
	ptr, err := r.reserveRange(&t, total, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	descs := append([]cuda.MemAccessDesc(nil), r.descs...)
	a := &allocation{base: ptr, size: size, reservations: []span{{ptr, total}}, resv: total, descs: descs, tag: r.opts.Tag, shared: "imported"}
	for i := range n {
		h, csize, err := open(i)
		if h != 0 {
			t.created(h)
		}
		if err != nil {
			return nil, fmt.Errorf("%s chunk %d: %w", op, i, r.rollback(&t, err))
		}
		at := ptr + cuda.DevicePtr(a.mapped)
		if err := r.drv.MemMap(at, csize, 0, h); err != nil {
			return nil, fmt.Errorf("%s chunk %d: %w", op, i, r.rollback(&t, err))
		}
		t.mapped(at, csize)
		a.chunks = append(a.chunks, chunk{off: a.mapped, size: csize, h: h})
		a.mapped += csize
	}
	if err := r.drv.MemSetAccess(ptr, total, descs...); err != nil {
		return nil, fmt.Errorf("%s: %w", op, r.rollback(&t, err))
	}
	r.mu.Lock()
	r.allocs[ptr] = a
	r.mu.Unlock()
	return buffer.Owned(ptr, size, r, nil), nil
}
