package buffer

import (
	"github.com/cudamem/cudamem/cuda"
)

// Fill8 sets every byte of the buffer to v, ordered on s (nil: the
// buffer's stream).
func (b *Buffer) Fill8(v uint8, s *cuda.Stream) error { return b.fill("Buffer.Fill8", 1, uint32(v), s) }

// Fill16 sets every 16-bit word of the buffer to v, ordered on s (nil: the
// buffer's stream). The size must be a multiple of 2 and the address
// 2-byte aligned (a view may not be); otherwise the error matches
// [cuda.ErrInvalidArgument].
func (b *Buffer) Fill16(v uint16, s *cuda.Stream) error {
	return b.fill("Buffer.Fill16", 2, uint32(v), s)
}

// Fill32 sets every 32-bit word of the buffer to v, ordered on s (nil: the
// buffer's stream). The size must be a multiple of 4 and the address
// 4-byte aligned; otherwise the error matches [cuda.ErrInvalidArgument].
func (b *Buffer) Fill32(v uint32, s *cuda.Stream) error { return b.fill("Buffer.Fill32", 4, v, s) }

func (b *Buffer) fill(op string, width uint64, v uint32, s *cuda.Stream) error {
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	if b.size%width != 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer size %d is not a multiple of the fill width %d", b.size, width)
	}
	if uint64(ptr)%width != 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer address %#x is not aligned to the fill width %d", uint64(ptr), width)
	}
	if b.size == 0 {
		return nil
	}
	if s, err = b.streamFor(op, s); err != nil {
		return err
	}
	switch width {
	case 1:
		return s.MemsetD8Async(ptr, uint8(v), b.size)
	case 2:
		return s.MemsetD16Async(ptr, uint16(v), b.size/2)
	default:
		return s.MemsetD32Async(ptr, v, b.size/4)
	}
}
