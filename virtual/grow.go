package virtual

import (
	"errors"
	"fmt"
	"sort"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// take finds b's allocation and hands b's ownership to the caller: b must
// be a live, owned buffer from this resource.
func (r *Resource) take(op string, b *buffer.Buffer) (*allocation, *cuda.Stream, error) {
	if err := r.check(op); err != nil {
		return nil, nil, err
	}
	if b == nil {
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	if b.Resource() != buffer.MemoryResource(r) {
		if b.IsClosed() {
			return nil, nil, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		}
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v does not belong to this resource", b)
	}
	ptr := b.Ptr()
	r.mu.Lock()
	a := r.allocs[ptr]
	r.mu.Unlock()
	if a == nil || !b.IsOwned() {
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is not a whole allocation of this resource", b)
	}
	return a, b.Stream(), nil
}

// refuseHeld refuses to move or unmap b's memory while a Hold (a DLPack
// export, say) lends it out: checked before any driver call, since the
// Buffer could not be rewrapped afterwards and the holder would be left
// with memory unmapped under it.
func refuseHeld(op string, b *buffer.Buffer) error {
	if n := b.Holds(); n > 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is held by %d Hold(s) (a DLPack export, say): release them before it is moved or unmapped", b, n)
	}
	return nil
}

// live reports, under r.mu, whether a is still filed under ptr and usable.
func (r *Resource) live(op string, ptr cuda.DevicePtr, a *allocation) error {
	if r.allocs[ptr] != a {
		return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	return nil
}

// Grow returns a buffer of newSize bytes holding b's data, and closes b
// (without freeing). The pointer stays the same unless the address space
// after the allocation is taken; no data is copied either way. When the
// allocation must move, Grow first waits for b's stream (nil: the legacy
// default stream), so work already submitted on it is done before the old
// addresses are unmapped; work on other streams is the caller's to order,
// as for Close. A newSize not above b's size returns b unchanged. Grow
// consumes b: do not use b concurrently with it.
//
// On error with a nil buffer, the grow did not happen and b is untouched
// (anything its undoing could not give back is kept for a retry, see
// Reclaim). A non-nil buffer with an error means the grow took effect: b
// is consumed and the returned buffer is the one to use and close, but
// some address space or mappings no longer needed (the old range after a
// move, or a range the driver granted at the wrong address) could not be
// given back. They are kept and retried by later operations and by
// Reclaim, and the error wraps buffer.ErrPartlyFreed, so
// errors.Is(err, buffer.ErrPartlyFreed) tells this case apart.
func (r *Resource) Grow(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	const op = "Resource.Grow"
	a, s, err := r.take(op, b)
	if err == nil {
		err = refuseHeld(op, b)
	}
	if err != nil {
		return nil, err
	}
	if newSize <= b.Size() {
		return b, nil
	}
	need, ok := r.roundUp(newSize)
	if !ok {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "size %d rounded up to the granularity %d overflows", newSize, r.gran)
	}
	r.retryLeftovers()
	oldPtr := b.Ptr() // before r.mu: Buffer locks are never taken under r.mu
	r.mu.Lock()
	if err := r.live(op, oldPtr, a); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	var cleanup error
	if need > a.mapped {
		if cleanup, err = r.extend(a, need, s); err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("%s %#x from %d to %d bytes: %w", op, uint64(oldPtr), b.Size(), newSize, err)
		}
	}
	r.rekey(oldPtr, a)
	a.size = newSize
	base := a.base
	r.mu.Unlock()
	nb, err := r.rewrap(b, base, newSize, s)
	if err != nil {
		return nil, errors.Join(err, cleanup)
	}
	if cleanup != nil {
		return nb, fmt.Errorf("%s %#x to %d bytes (done, now at %#x): %w: %w", op, uint64(oldPtr), newSize, uint64(base), buffer.ErrPartlyFreed, cleanup)
	}
	return nb, nil
}

// rekey files a under its (possibly new) base. Called with r.mu held.
//
// Lock order: a Buffer's lock, then r.mu (Close holds the first while
// Deallocate takes the second). So nothing here calls a Buffer method
// (Ptr, String, Disown...) while holding r.mu.
func (r *Resource) rekey(oldPtr cuda.DevicePtr, a *allocation) {
	if a.base != oldPtr {
		delete(r.allocs, oldPtr)
		r.allocs[a.base] = a
	}
}

// rewrap moves ownership from b to a new buffer at base. It must not be
// called with r.mu held (it takes b's lock, and Close holds b's lock while
// it takes r.mu).
func (r *Resource) rewrap(b *buffer.Buffer, base cuda.DevicePtr, size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	if _, _, err := b.Disown(); err != nil {
		return nil, err
	}
	return buffer.Owned(base, size, r, s), nil
}

// extend maps memory so a covers need bytes. Called with r.mu held. On
// error a is as it was; cleanup reports leftovers of a completed move.
func (r *Resource) extend(a *allocation, need uint64, s *cuda.Stream) (cleanup, err error) {
	add := need - a.mapped
	reserved := a.reserved()
	var t txn
	t.start()
	var grown *span
	if need > reserved {
		// Ask for the address space right after ours.
		extra := need - reserved
		hint := a.base + cuda.DevicePtr(reserved)
		if uint64(hint)+extra < uint64(hint) {
			return r.remap(a, need, s) // no room before the top of the address space
		}
		p, err := r.drv.MemAddressReserve(extra, r.gran, hint)
		if err != nil {
			// Not granted: moving is the designed fallback, and its own
			// failure is what the caller hears about.
			return r.remap(a, need, s)
		}
		if p != hint {
			// Granted elsewhere: of no use, so give it back and move. A
			// failure to free it is kept for a retry and reported with
			// the outcome of the move (as cleanup if the move succeeds).
			var stray error
			if ferr := r.drv.MemAddressFree(p, extra); ferr != nil {
				r.left.keep(&leftovers{spans: []span{{p, extra}}})
				stray = fmt.Errorf("freeing the %d bytes of address space granted at %#x instead of %#x: %w (kept for a retry)", extra, uint64(p), uint64(hint), ferr)
			}
			cleanup, err := r.remap(a, need, s)
			if err != nil {
				return nil, errors.Join(err, stray)
			}
			return errors.Join(cleanup, stray), nil
		}
		t.reserved(p, extra)
		grown = &span{p, extra}
	}
	h, err := r.newChunk(&t, a.base+cuda.DevicePtr(a.mapped), add, a.descs)
	if err != nil {
		return nil, r.rollback(&t, err)
	}
	if grown != nil {
		a.reservations = append(a.reservations, *grown)
		a.resv += grown.size
	}
	a.chunks = append(a.chunks, chunk{off: a.mapped, size: add, h: h})
	a.mapped = need
	return nil, nil
}

// remap builds the allocation again in a new range of need bytes: the old
// chunks are mapped there too (the same physical memory: nothing is
// copied), a new chunk fills the rest, access is set on the whole new
// range at once, then the old range is unmapped (in one call: its
// mappings are contiguous) and given back. So a move costs one map per
// chunk plus a constant, no more than remapping the chunks.
// If anything fails before the move, the old allocation is left as it was.
// Failures to give back the old range come after the move: they are kept
// for a retry and reported as cleanup.
func (r *Resource) remap(a *allocation, need uint64, s *cuda.Stream) (cleanup, err error) {
	reserve := max(need, r.reserve)
	var t txn
	t.start()
	np, err := r.reserveRange(&t, reserve, 0)
	if err != nil {
		return nil, r.rollback(&t, err)
	}
	for _, c := range a.chunks {
		at := np + cuda.DevicePtr(c.off)
		if err := r.drv.MemMap(at, c.size, 0, c.h); err != nil {
			return nil, r.rollback(&t, err)
		}
		t.mapped(at, c.size)
	}
	h, err := r.drv.MemCreate(need-a.mapped, &r.prop)
	if err != nil {
		return nil, r.rollback(&t, err)
	}
	t.created(h)
	at := np + cuda.DevicePtr(a.mapped)
	if err := r.drv.MemMap(at, need-a.mapped, 0, h); err != nil {
		return nil, r.rollback(&t, err)
	}
	t.mapped(at, need-a.mapped)
	if err := r.drv.MemSetAccess(np, need, a.descs...); err != nil {
		return nil, r.rollback(&t, err)
	}
	// The new range is complete. Work already submitted may still use the
	// old addresses: let it finish before they go.
	if err := r.wait("Resource.Grow", s); err != nil {
		return nil, r.rollback(&t, err)
	}
	oldBase, oldMapped, oldResv := a.base, a.mapped, a.reservations
	a.base = np
	a.setReservations([]span{{np, reserve}})
	a.chunks = append(a.chunks, chunk{off: a.mapped, size: need - a.mapped, h: h})
	a.mapped = need
	// The handles now belong to the new range; the old range holds only
	// its mappings (chunks back to back from oldBase) and address space.
	old := leftovers{maps: []span{{oldBase, oldMapped}}, spans: oldResv}
	if rerr := reap(r.drv, &old); rerr != nil {
		cleanup = fmt.Errorf("giving back the old range at %#x: %w (kept for a retry)", uint64(oldBase), rerr)
	}
	r.left.keep(&old)
	return cleanup, nil
}

// Shrink returns a buffer of newSize bytes holding the start of b's data,
// and closes b (without freeing). Whole chunks past the new size are
// unmapped and released; the address space stays reserved, so a later
// Grow back is in place. A newSize not below b's size returns b unchanged.
// Before unmapping anything it waits for b's stream (nil: the legacy
// default stream); a shrink that stays within the last chunk unmaps
// nothing and waits for nothing.
//
// On error with a nil buffer, the shrink did not happen and b is
// untouched. A non-nil buffer with an error means the shrink took effect
// (b is consumed and the returned buffer is the one to use and close:
// nothing addresses the unmapped tail) but some chunks could not be given
// back: they stay mapped in the allocation (Info counts them; Close frees
// them) or are kept and retried by later operations and by Reclaim. That
// error wraps buffer.ErrPartlyFreed, so errors.Is tells the two apart.
func (r *Resource) Shrink(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	const op = "Resource.Shrink"
	a, s, err := r.take(op, b)
	if err == nil {
		err = refuseHeld(op, b)
	}
	if err != nil {
		return nil, err
	}
	if newSize >= b.Size() {
		return b, nil
	}
	if newSize == 0 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "new size 0 for buffer %v: close the buffer instead", b)
	}
	r.retryLeftovers()
	oldPtr := b.Ptr()
	oldSize := b.Size()
	need, _ := r.roundUp(newSize) // below b's size, which was rounded up once already
	// Keep the chunks that start below need: chunk 0 always (need > 0).
	// If that unmaps any, wait for b's stream first (outside r.mu); a
	// shrink within the last chunk unmaps nothing and waits for nothing.
	var i int
	for waited := false; ; waited = true {
		r.mu.Lock()
		if err := r.live(op, oldPtr, a); err != nil {
			r.mu.Unlock()
			return nil, err
		}
		i = sort.Search(len(a.chunks), func(i int) bool { return a.chunks[i].off >= need })
		if i == len(a.chunks) || waited {
			break // holding r.mu
		}
		r.mu.Unlock()
		if err := r.wait(op, s); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	k, err := r.unmapFrom(a, i)
	if err != nil && k == len(a.chunks) {
		r.mu.Unlock()
		return nil, fmt.Errorf("%s %#x from %d to %d bytes: %w", op, uint64(oldPtr), oldSize, newSize, err)
	}
	// Taking effect: a.chunks[k:] are unmapped (k >= i, so everything below
	// need is still mapped). The size shrinks with them, so nothing can
	// address the unmapped range.
	var gone leftovers
	for _, c := range a.chunks[k:] {
		gone.handles = append(gone.handles, c.h)
	}
	if k < len(a.chunks) {
		a.mapped = a.chunks[k].off
	}
	a.chunks = a.chunks[:k]
	a.size = newSize
	if rerr := reap(r.drv, &gone); rerr != nil {
		err = errors.Join(err, rerr)
	}
	r.left.keep(&gone)
	base, mapped := a.base, a.mapped
	r.mu.Unlock()
	nb, derr := r.rewrap(b, base, newSize, s)
	if derr != nil {
		return nil, errors.Join(derr, err)
	}
	if err != nil {
		return nb, fmt.Errorf("%s %#x from %d to %d bytes (done; %d bytes still mapped): %w: %w", op, uint64(oldPtr), oldSize, newSize, mapped, buffer.ErrPartlyFreed, err)
	}
	return nb, nil
}
