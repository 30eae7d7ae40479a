package buffer

import (
	"errors"

	"github.com/cudamem/cudamem/cuda"
)

// CopyTo copies the buffer's contents into dst, ordered on s (nil: this
// buffer's stream; see the package documentation). The sizes must be equal;
// slice a buffer first to copy part of it. Views of one allocation must not
// overlap. Memory on two different devices
// is copied with cuMemcpyPeerAsync, anything else with cuMemcpyAsync. The
// copy is asynchronous: synchronize s before the CPU reads dst.
func (b *Buffer) CopyTo(dst *Buffer, s *cuda.Stream) error {
	return copyBuffers("Buffer.CopyTo", dst, b, b, s)
}

// CopyFrom copies src's contents into the buffer, ordered on s (nil: this
// buffer's stream). It is [Buffer.CopyTo] seen from the destination.
func (b *Buffer) CopyFrom(src *Buffer, s *cuda.Stream) error {
	return copyBuffers("Buffer.CopyFrom", b, src, b, s)
}

// Clone allocates a buffer of the same size from mr (nil: this buffer's
// own resource) and copies the contents into it, ordered on s (nil: this
// buffer's stream, which also becomes the clone's allocation stream). It
// is cuda.core's copy_to with no destination. The caller owns the clone.
func (b *Buffer) Clone(mr MemoryResource, s *cuda.Stream) (*Buffer, error) {
	const op = "Buffer.Clone"
	if _, err := b.acquire(op); err != nil {
		return nil, err
	}
	if mr == nil {
		if mr = b.homeOf().mr; mr == nil {
			b.release()
			return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "a destination resource must be given (this buffer does not have a MemoryResource)")
		}
	}
	s, err := b.streamFor(op, s)
	b.release()
	if err != nil {
		return nil, err
	}
	out, err := Allocate(mr, b.size, s)
	if err != nil {
		return nil, err
	}
	if err := out.CopyFrom(b, s); err != nil {
		return nil, errors.Join(err, out.Close())
	}
	return out, nil
}

// copyBuffers copies src into dst on s, resolved through self.
func copyBuffers(op string, dst, src, self *Buffer, s *cuda.Stream) error {
	// Neither acquire waits (see the state word), so holding one while
	// taking the other cannot deadlock, whatever the order and even when
	// both are views of one allocation.
	dp, err := dst.acquire(op)
	if err != nil {
		return err
	}
	defer dst.release()
	sp, err := src.acquire(op)
	if err != nil {
		return err
	}
	defer src.release()
	if src.size != dst.size {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer sizes mismatch between src and dst (sizes are: src=%d, dst=%d)", src.size, dst.size)
	}
	if src.size == 0 {
		return nil
	}
	if src.rootOf() == dst.rootOf() && src.ptr < dst.ptr+cuda.DevicePtr(dst.size) && dst.ptr < src.ptr+cuda.DevicePtr(src.size) {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "src and dst overlap (views of one allocation at offsets %d and %d, %d bytes)", src.off(), dst.off(), src.size)
	}
	s, err = self.streamFor(op, s)
	if err != nil {
		return err
	}
	spr, dpr := src.props(), dst.props()
	if spr.device >= 0 && dpr.device >= 0 && spr.device != dpr.device && !spr.hostAcc && !dpr.hostAcc {
		sd, err := cuda.GetDevice(spr.device)
		if err != nil {
			return err
		}
		dd, err := cuda.GetDevice(dpr.device)
		if err != nil {
			return err
		}
		return s.MemcpyPeerAsync(dp, dd, sp, sd, src.size)
	}
	return s.MemcpyAsync(dp, sp, src.size)
}
