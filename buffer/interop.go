package buffer

import (
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// PtrErr is Ptr with an error: the buffer's address, or an error matching
// cuda.ErrClosed once the buffer (or, for a view, its owner or a view it
// was sliced from) is closed, and cuda.ErrInvalidArgument for a nil or
// zero Buffer or one whose range no memory can have. Ptr returns 0 in all
// those cases; use PtrErr where a silent 0 would reach foreign code.
//
// The address is valid only while the buffer stays open: to keep it open
// for the length of a foreign call, use Use (or the package function Use
// for several buffers at once).
func (b *Buffer) PtrErr() (cuda.DevicePtr, error) {
	const op = "Buffer.PtrErr"
	if b == nil {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	if err := b.invalid(op); err != nil {
		return 0, err
	}
	if b.IsClosed() {
		return 0, &cuda.OpError{Op: op, Err: fmt.Errorf("%w: buffer of %d bytes", cuda.ErrClosed, b.size)}
	}
	return b.ptr, nil
}

// Use runs f with the addresses of bufs (in their order) while keeping
// every one of them open: Close (and Disown) of any of them waits until f
// returns, so f may hand the addresses to foreign code (a cuBLAS call, a
// kernel launch) without racing a concurrent Close. op names the
// operation in errors.
//
// Use never waits for a lock, so it cannot deadlock against Close: a
// buffer whose Close is under way (or done) makes Use fail at once with an
// error matching cuda.ErrClosed that names the buffer's position, and f is
// not run. A nil or zero Buffer among bufs is an error matching
// cuda.ErrInvalidArgument. The same buffer may appear more than once. f
// must not close or disown any of bufs, nor wait for a goroutine that does.
//
// Use holds the buffers for the host-side call only: order the free after
// foreign asynchronous work ([Buffer.CloseAfter]) before closing.
func Use(op string, f func(ptrs []cuda.DevicePtr) error, bufs ...*Buffer) error {
	if f == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil function")
	}
	ptrs := make([]cuda.DevicePtr, len(bufs))
	held := 0
	defer func() {
		for i := held - 1; i >= 0; i-- {
			bufs[i].release()
		}
	}()
	for i, b := range bufs {
		p, err := b.acquire(op)
		if err != nil {
			return fmt.Errorf("%w (buffer %d of %d)", err, i, len(bufs))
		}
		ptrs[i] = p
		held++
	}
	return f(ptrs)
}

// CloseAfter closes b with its free ordered after all the work submitted
// so far to each of streams, as well as its allocation stream's: the
// allocation stream (the device's legacy default stream when the buffer
// has none) waits for each of streams through an event, then the buffer
// is closed on it. Use it when foreign code (cuBLAS, a PyTorch kernel, a
// stream wrapped with cuda.Device.WrapStream) used the memory on its own
// streams; for one such stream, CloseOn(that stream) does the same
// without the wait.
//
// A nil stream among streams adds nothing. If a wait cannot be ordered
// the buffer stays open and the error says why; while any of the streams,
// or the allocation stream, captures a graph the other is not in, nothing
// is submitted and the error matches cuda.ErrCapturing (see
// cuda.RefuseOrder); a zero cuda.Stream is an error matching
// cuda.ErrInvalidArgument. Views and borrowed buffers are only closed.
// Like Close, it is idempotent and must not be called from inside Use on
// the same buffer. The order is only as good as the resource's
// Deallocate: pools free in stream order.
func (b *Buffer) CloseAfter(streams ...*cuda.Stream) error {
	const op = "Buffer.CloseAfter"
	if b.IsClosed() {
		return nil
	}
	var after []*cuda.Stream
	for i, s := range streams {
		if err := checkStream(op, s); err != nil {
			return fmt.Errorf("%w (stream %d of %d)", err, i, len(streams))
		}
		if s != nil {
			after = append(after, s)
		}
	}
	if len(after) == 0 || !b.IsOwned() || b.word.Load()&badBit != 0 {
		return b.Close()
	}
	if !b.use() {
		return b.Close() // closed or being closed meanwhile: Close waits for that
	}
	target, err := b.streamFor(op, nil)
	b.release()
	if err != nil {
		return err
	}
	// Decide every wait before making any, so a refusal submits nothing.
	for _, s := range after {
		if err := cuda.RefuseOrder(op, target, s); err != nil {
			return fmt.Errorf("%w (the buffer stays open)", err)
		}
	}
	for _, s := range after {
		if s == target {
			continue
		}
		if err := target.WaitStream(s); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("ordering the free of %v after stream %#x of %v: %w (the buffer stays open)", b, s.Handle(), s.Device(), err)}
		}
	}
	return b.CloseOn(target)
}
