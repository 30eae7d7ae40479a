package buffer

import (
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/ownedmem"
)

// Disown hands an owned buffer's memory to the caller: the buffer becomes
// closed (later use returns cuda.ErrClosed) without freeing anything, and
// the garbage-collection safety net is stopped. Resources use it to move
// memory into a new Buffer, as when a virtual-memory allocation grows.
// Views and borrowed buffers cannot be disowned, nor can a buffer with
// live Holds ([Buffer.Hold]): their holders rely on the memory staying
// put. If a host view ([Buffer.Bytes]) of the memory was handed out, the
// next buffer Owned at the same address inherits that, so its safety net
// will not free under the view either.
func (b *Buffer) Disown() (ptr cuda.DevicePtr, size uint64, err error) {
	if b == nil {
		return 0, 0, cuda.Errorf("Buffer.Disown", cuda.ErrInvalidArgument, "nil buffer")
	}
	if b.isZero() {
		return 0, 0, zeroErr("Buffer.Disown")
	}
	if !b.IsOwned() {
		return 0, 0, cuda.Errorf("Buffer.Disown", cuda.ErrInvalidArgument, "buffer %#x (%d bytes) is a view or borrowed", uint64(b.ptr), b.size)
	}
	if !b.beginClose() {
		return 0, 0, &cuda.OpError{Op: "Buffer.Disown", Err: cuda.ErrClosed}
	}
	if x := b.x.Load(); x != nil {
		if n := x.holds.Load() & holdCount; n > 0 {
			// The memory must stay where the holders saw it: moving it on
			// (a virtual allocation's remap) would pull it from under them.
			b.endClose(false)
			return 0, 0, cuda.Errorf("Buffer.Disown", cuda.ErrInvalidArgument, "buffer %#x (%d bytes) is held by %d Hold(s) (an export, such as DLPack's): release them first", uint64(b.ptr), b.size, n)
		}
	}
	if b.ptr != 0 {
		w := b.word.Load()
		handOff(b.ptr, w)
		if w&unrecordedBit != 0 {
			// The memory becomes a plain pointer of the resource, which its
			// Deallocate (or a new Owned buffer's Close) will free.
			ownedmem.Adopt(b.mr, b.ptr, b.size)
		}
	}
	b.endClose(true)
	return b.ptr, b.size, nil
}
