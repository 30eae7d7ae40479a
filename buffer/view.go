package buffer

import (
	"github.com/cudamem/cudamem/cuda"
)

// Bytes returns the buffer's memory as a byte slice, for host-accessible
// memory only (pinned host and managed memory; see
// [Buffer.HostAccessible]). For device memory the error matches
// [cuda.ErrInvalidArgument]: copy it with [CopyToHost] or
// [Buffer.ReadAt] instead.
//
// The slice aliases the buffer and is not tracked: it is invalid once the
// buffer (or its owner) is closed, and using it then may crash. Synchronize
// the streams that write the memory before reading the slice, and those
// that read it after writing.
//
// The slice does not keep the buffer alive, so an allocation whose Bytes
// were taken is never freed by the garbage-collection safety net: if its
// buffer is lost without Close, the memory stays allocated and is counted
// by [LeaksKept]. Close it explicitly.
func (b *Buffer) Bytes() ([]byte, error) {
	const op = "Buffer.Bytes"
	ptr, err := b.acquire(op)
	if err != nil {
		return nil, err
	}
	defer b.release()
	if !b.props().hostAcc {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "the memory at %#x is not host-accessible (device memory); copy it to the host with CopyToHost or ReadAt", uint64(ptr))
	}
	if b.size == 0 {
		return []byte{}, nil
	}
	p, err := hostSlice(op, ptr, b.size)
	if err != nil {
		return nil, err
	}
	// Marked while the buffer is held: a collection can only find it
	// lost after this call returns.
	if r := b.rootOf(); r.word.Load()&viewedBit == 0 {
		r.word.Or(viewedBit)
	}
	return p, nil
}

// Slice returns a view of n bytes of the buffer starting at off. A view
// shares the memory and never frees it: closing it only ends its own use
// (and that of views sliced from it). It keeps its owner from being
// garbage collected, and fails with an error matching [cuda.ErrClosed]
// once the owner is closed. Views of views work; offsets add up. A range
// beyond the buffer is an error matching [cuda.ErrInvalidArgument].
func (b *Buffer) Slice(off, n uint64) (*Buffer, error) {
	const op = "Buffer.Slice"
	if _, err := b.acquire(op); err != nil {
		return nil, err
	}
	defer b.release()
	if off > b.size || n > b.size-off {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "range off=%d, n=%d is out of bounds of a buffer of size %d", off, n, b.size)
	}
	v := &Buffer{ptr: b.ptr + cuda.DevicePtr(off), size: n}
	v.ext.Store(&ext{root: b.rootOf(), parent: b})
	v.word.Store(initBit | viewBit)
	return v, nil
}
