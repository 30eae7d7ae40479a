package buffer

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cudamem/cudamem/cuda"
)

// Holds keep an allocation's memory from being freed while code outside
// Go's view uses it (a DLPack consumer, which gives it back through a
// deleter whenever it likes). Close of a held buffer closes it for Go at
// once and returns nil, and leaves the free to the last Release: Close is
// called from defers, and must neither fail nor wait on a consumer's
// schedule.
//
// The count and the flag share one word, the root's ext.holds, so that
// the last Release and a Close racing it agree on who frees without a
// lock: Hold adds only within a call (acquire), so never during a Close;
// Close (once it is the closer) sets heldFree only while the count is
// non-zero, by compare-and-swap, and otherwise frees itself; Release
// frees only when its decrement leaves exactly heldFree. Releases never
// wait for a Close, so they may run inside a Use of the same buffer.
const (
	heldFree  = uint64(1) << 63
	holdCount = heldFree - 1
)

// Hold keeps a buffer's memory allocated until Release, even if the
// buffer (or its owner, for a view) is closed meanwhile. See
// [Buffer.Hold].
type Hold struct {
	r    *Buffer // the root: the owner (or borrowed buffer) of the memory
	ptr  cuda.DevicePtr
	size uint64
	done atomic.Bool
}

// Hold keeps the memory of b allocated until the returned Hold is
// released, for code that uses it outside Go's view (an export to a C
// library, as package dlpack does). op names the operation in errors.
//
// While a Hold is live, Close (and CloseOn, CloseAfter) of the buffer, or
// of its owner if b is a view, closes the Buffer for Go at once and
// returns nil, but does not free the memory: the last Release does, on
// the stream Close was given (or the allocation stream). A held buffer
// cannot be disowned. Holds of a borrowed buffer ([FromPointer]) keep
// nothing: its memory was never the Buffer's to free.
//
// Hold fails as other methods do. The Hold keeps the Buffer reachable,
// so the garbage-collection safety net does not free held memory either.
func (b *Buffer) Hold(op string) (*Hold, error) {
	ptr, err := b.acquire(op)
	if err != nil {
		return nil, err
	}
	defer b.release()
	r := b.rootOf() // within a call: no Close is deciding heldFree
	r.makeExt().holds.Add(1)
	return &Hold{r: r, ptr: ptr, size: b.size}, nil
}

// Holds returns how many Holds of the buffer's memory are live (those of
// its owner and of every view share one count); 0 for nil and zero
// Buffers.
func (b *Buffer) Holds() int {
	if b.isZero() {
		return 0
	}
	return int(b.rootOf().holds())
}

// holds is root r's count of live Holds.
func (r *Buffer) holds() uint64 {
	if x := r.ext.Load(); x != nil {
		return x.holds.Load() & holdCount
	}
	return 0
}

// Ptr is the address of the held range (that of the buffer Hold was
// called on), valid until Release; 0 for a nil Hold.
func (h *Hold) Ptr() cuda.DevicePtr {
	if h == nil {
		return 0
	}
	return h.ptr
}

// Size is the size of the held range in bytes.
func (h *Hold) Size() uint64 {
	if h == nil {
		return 0
	}
	return h.size
}

// Release ends the hold. If the buffer was closed while held and this was
// the last hold, Release frees the memory through the resource, on the
// stream Close was given or, if that stream is closed by now, on the
// resource's default stream. If that free fails, Release returns its
// error and the hold stays live, so Release may be called again (once a
// capture that refused the free is over, say). Release is idempotent, does
// nothing on a nil Hold, and never waits for a lock: it may be called
// from anywhere, inside [Buffer.Use] on the same buffer included.
func (h *Hold) Release() error {
	if h == nil || h.r == nil || !h.done.CompareAndSwap(false, true) {
		return nil
	}
	r := h.r
	x := r.ext.Load() // made by Hold
	if x.holds.Add(^uint64(0)) != heldFree {
		return nil // others still hold, or the buffer is open: Close frees
	}
	// Close left the free to us, and no hold can come again. If nothing
	// is freed (an error, or a panic in the resource's code), the hold is
	// live again, for a later Release to retry.
	freed := false
	defer func() {
		if !freed {
			x.holds.Add(1)
			h.done.Store(false)
		}
	}()
	err := freeOrFallback(x.freeBy, r.ptr, r.size, x.freeStream)
	freed = err == nil || errors.Is(err, ErrPartlyFreed)
	if err != nil {
		return fmt.Errorf("buffer close (%#x, %d bytes), left to the last Hold's Release: %w", uint64(r.ptr), r.size, err)
	}
	return nil
}

// deferFree is Close's half: called by the closer of an open owned buffer
// homed at h, whose ext is x, it leaves the free on s to the last Release
// if any hold is live, and reports whether it did. A zero Stream is
// refused then: every Release would fail on it, and the memory would
// never be freed; refused now, the buffer stays open for a Close on a
// real stream.
func (r *Buffer) deferFree(x *ext, h *home, s *cuda.Stream) (bool, error) {
	for {
		v := x.holds.Load()
		if v&holdCount == 0 {
			return false, nil
		}
		if s != nil && s.Device() == nil {
			return false, cuda.Errorf("Buffer.CloseOn", cuda.ErrInvalidArgument,
				"zero cuda.Stream for the free of %#x (%d bytes), which %d Hold(s) leave to their last Release (use a stream a device made, or nil)", uint64(r.ptr), r.size, v&holdCount)
		}
		// Written before the swap publishes heldFree; Release reads them
		// only after seeing the flag.
		x.freeBy, x.freeStream = h.free, s
		if x.holds.CompareAndSwap(v, v|heldFree) {
			return true, nil
		}
	}
}
