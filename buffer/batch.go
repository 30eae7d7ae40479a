package buffer

import (
	"sync"

	"github.com/cudamem/cudamem/cuda"
)

// Copy is one copy of a batch ([CopyBatch]): Size bytes from Src at
// SrcOffset to Dst at DstOffset. Offsets are relative to each buffer (a
// view's offset 0 is the view's first byte).
type Copy struct {
	Dst, Src             *Buffer
	DstOffset, SrcOffset uint64
	Size                 uint64
}

// CopyBatch submits copies as one batch ordered on s: the batch starts
// after the work already submitted to s, and the copies within it run in
// no particular order, so none may depend on another. Where the driver
// has cuMemcpyBatchAsync (CUDA 12.8 and later) the batch goes to it in
// calls of up to 1,024 copies, which for many small copies cost far less
// than a call each; otherwise, and on the legacy default stream (which
// cuMemcpyBatchAsync does not accept), it is a loop of cuMemcpyAsync with
// the same results (see [cuda.Device.MemcpyBatchPath]). Like every copy
// here it is asynchronous.
//
// A nil s means the stream copies[0].Dst would use for a copy of its own.
// Every buffer must be memory the stream's device can reach: its memory,
// pinned host memory, or managed memory (copy between devices with
// [Buffer.CopyTo], and from Go slices with [CopyFromHost]).
//
// Every copy is checked, and every buffer held open (as a single copy
// holds its two, without waiting), before anything is submitted; if one
// is bad nothing is: a nil, zero or closed buffer (or one whose Close is
// under way), a range past a buffer's end, a source and destination that
// overlap within one allocation, a buffer on the wrong device, or a zero
// stream. The error matches [cuda.ErrInvalidArgument] or [cuda.ErrClosed]
// and carries a [*cuda.BatchCopyError] naming the copy (find it with
// errors.As). A copy of 0 bytes is checked, then skipped; no copies at all
// is a no-op. A failure the driver ties to one copy names it the same
// way; a failed batch may have submitted some of its copies.
//
// The copies read their sources in stream order
// ([cuda.MemcpySrcAccessOrderStream]). A copy whose operand is managed
// memory tells the driver where that memory is meant to live (its
// resource's device); other operands get no location hint, which the
// driver only uses for managed memory.
func CopyBatch(s *cuda.Stream, copies []Copy) error {
	const op = "CopyBatch"
	if err := checkStream(op, s); err != nil {
		return err
	}
	n := len(copies)
	if n == 0 {
		return nil
	}
	for i := range copies {
		c := &copies[i]
		switch {
		case c.Dst == nil || c.Src == nil:
			return cuda.BatchErrorf(op, i, n, cuda.ErrInvalidArgument, "nil buffer (dst %v, src %v)", c.Dst, c.Src)
		case c.Dst.isZero() || c.Src.isZero():
			return cuda.BatchErrorf(op, i, n, cuda.ErrInvalidArgument, "zero Buffer (dst %v, src %v; buffers come from a MemoryResource, Owned or FromPointer)", c.Dst, c.Src)
		}
	}

	// Hold every buffer open: acquire never waits, so the order and any
	// repeats do not matter. A run of copies between the same buffers
	// (the common case) holds each once: the host time between two
	// batches is time the copy engine may run dry.
	sc := getScratch(n)
	defer putScratch(sc)
	held := sc.held[:0]
	defer func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].release()
		}
		sc.held = held
	}()
	var lastDst, lastSrc *Buffer
	var dp, sp cuda.DevicePtr
	for i := range copies {
		c := &copies[i]
		if c.Dst != lastDst {
			p, err := c.Dst.acquire(op)
			if err != nil {
				return batchWrap(err, i, n, "destination", c.Dst)
			}
			held = append(held, c.Dst)
			lastDst, dp = c.Dst, p
		}
		if c.Src != lastSrc {
			p, err := c.Src.acquire(op)
			if err != nil {
				return batchWrap(err, i, n, "source", c.Src)
			}
			held = append(held, c.Src)
			lastSrc, sp = c.Src, p
		}
		if err := c.checkRange(op, i, n); err != nil {
			return err
		}
		sc.dsts[i] = dp + cuda.DevicePtr(c.DstOffset)
		sc.srcs[i] = sp + cuda.DevicePtr(c.SrcOffset)
		sc.sizes[i] = c.Size
	}

	if s == nil {
		var err error
		if s, err = copies[0].Dst.streamFor(op, nil); err != nil {
			return err
		}
	}
	dev := s.Device().Ordinal()
	var last cuda.MemcpyAttributes
	var dl, sl cuda.MemLocation
	lastDst, lastSrc = nil, nil
	for i := range copies {
		c := &copies[i]
		var err error
		if c.Dst != lastDst {
			if dl, err = batchLoc(op, c.Dst, dev, i, n, "destination"); err != nil {
				return err
			}
			lastDst = c.Dst
		}
		if c.Src != lastSrc {
			if sl, err = batchLoc(op, c.Src, dev, i, n, "source"); err != nil {
				return err
			}
			lastSrc = c.Src
		}
		a := cuda.MemcpyAttributes{SrcAccessOrder: cuda.MemcpySrcAccessOrderStream, SrcLocHint: sl, DstLocHint: dl}
		if i == 0 || a != last {
			sc.attrs = append(sc.attrs, a)
			sc.idxs = append(sc.idxs, uint64(i))
			last = a
		}
	}
	return submitBatch(s, sc.dsts, sc.srcs, sc.sizes, sc.attrs, sc.idxs)
}

// submitBatch is the driver call; tests replace it to see the arrays.
var submitBatch = (*cuda.Stream).MemcpyBatchAsync

// checkRange checks the copy's two ranges against its buffers, and that
// they do not overlap within one allocation.
func (c *Copy) checkRange(op string, i, n int) error {
	if c.DstOffset > c.Dst.size || c.Size > c.Dst.size-c.DstOffset {
		return cuda.BatchErrorf(op, i, n, cuda.ErrInvalidArgument, "destination range [%d, %d+%d) is past the end of the %d-byte buffer", c.DstOffset, c.DstOffset, c.Size, c.Dst.size)
	}
	if c.SrcOffset > c.Src.size || c.Size > c.Src.size-c.SrcOffset {
		return cuda.BatchErrorf(op, i, n, cuda.ErrInvalidArgument, "source range [%d, %d+%d) is past the end of the %d-byte buffer", c.SrcOffset, c.SrcOffset, c.Size, c.Src.size)
	}
	if c.Size > 0 && c.Src.rootOf() == c.Dst.rootOf() {
		so, do := c.Src.off()+c.SrcOffset, c.Dst.off()+c.DstOffset
		if so < do+c.Size && do < so+c.Size {
			return cuda.BatchErrorf(op, i, n, cuda.ErrInvalidArgument, "source and destination overlap (offsets %d and %d in one allocation, %d bytes)", so, do, c.Size)
		}
	}
	return nil
}

// batchLoc checks that the stream's device (ordinal dev) can reach b's
// memory and returns the location hint to give the driver: managed
// memory's device, none (the zero MemLocation) for the rest.
func batchLoc(op string, b *Buffer, dev, i, n int, what string) (cuda.MemLocation, error) {
	p := b.props()
	switch {
	case !p.devAcc:
		return cuda.MemLocation{}, cuda.BatchErrorf(op, i, n, cuda.ErrInvalidArgument, "the %s %v is memory no device can reach", what, b)
	case p.device >= 0 && p.device != dev:
		return cuda.MemLocation{}, cuda.BatchErrorf(op, i, n, cuda.ErrInvalidArgument, "the %s %v is on GPU %d, the stream on GPU %d (copy between devices with Buffer.CopyTo)", what, b, p.device, dev)
	case !(p.hostAcc && p.device >= 0):
		// Not managed memory: the driver has no use for a hint, and one
		// made large H→D batches slower.
		return cuda.MemLocation{}, nil
	}
	return cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(p.device)}, nil
}

// batchWrap names copy i's side in an error from acquire.
func batchWrap(err error, i, n int, what string, b *Buffer) error {
	oe, ok := err.(*cuda.OpError)
	if !ok {
		return err
	}
	return &cuda.OpError{Op: oe.Op, Err: &cuda.BatchCopyError{Index: i, Count: n, Err: &sideError{what + " " + b.String(), oe.Err}}}
}

type sideError struct {
	what string
	err  error
}

func (e *sideError) Error() string { return "the " + e.what + ": " + e.err.Error() }
func (e *sideError) Unwrap() error { return e.err }

// scratch holds a batch's arrays in the driver's layout between calls, so
// that batches of thousands of copies do not allocate each time.
type scratch struct {
	dsts, srcs []cuda.DevicePtr
	sizes      []uint64
	attrs      []cuda.MemcpyAttributes
	idxs       []uint64
	held       []*Buffer // the buffers CopyBatch holds; cleared before pooling
}

var scratchPool sync.Pool

// maxPooled is the largest batch whose arrays go back to the pool; the
// arrays of larger ones are left to the collector.
const maxPooled = 1 << 16

func getScratch(n int) *scratch {
	sc, _ := scratchPool.Get().(*scratch)
	if sc == nil || cap(sc.dsts) < n {
		sc = &scratch{dsts: make([]cuda.DevicePtr, n), srcs: make([]cuda.DevicePtr, n), sizes: make([]uint64, n)}
	}
	sc.dsts, sc.srcs, sc.sizes = sc.dsts[:n], sc.srcs[:n], sc.sizes[:n]
	sc.attrs, sc.idxs = sc.attrs[:0], sc.idxs[:0]
	return sc
}

func putScratch(sc *scratch) {
	clear(sc.held) // a pooled scratch must not keep Buffers from the leak net
	sc.held = sc.held[:0]
	if cap(sc.dsts) <= maxPooled {
		scratchPool.Put(sc)
	}
}
