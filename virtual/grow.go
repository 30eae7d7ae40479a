package virtual

import (
	"errors"
	"fmt"
	"sort"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// take finds b's allocation: b must be a live, owned buffer from this
// resource. It also returns b's address and stream. What it reads of b is
// read with b held open (b.Use), so a Close racing it gives
// cuda.ErrClosed, never a lookup of the zero address a closed buffer
// reports. A Close may still come after take returns: callers recheck
// under r.mu, with b held again (useLive, beginResize).
func (r *Resource) take(op string, b *buffer.Buffer) (*allocation, cuda.DevicePtr, *cuda.Stream, error) {
	if err := r.check(op); err != nil {
		return nil, 0, nil, err
	}
	if b == nil {
		return nil, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	var a *allocation
	var ptr cuda.DevicePtr
	err := b.Use(op, func(p cuda.DevicePtr) error {
		if !b.IsOwned() {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is a view or borrowed, not a whole allocation of this resource", b)
		}
		// b is held open, so an owned b has its resource, unless a Close
		// has begun (it waits for this call, then frees): that Close wins.
		switch mr := b.Resource(); mr {
		case nil:
			return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		case buffer.MemoryResource(r):
		default:
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v does not belong to this resource", b)
		}
		r.mu.Lock()
		a = r.allocs[p]
		r.mu.Unlock()
		if a == nil {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is not a whole allocation of this resource", b)
		}
		ptr = p
		return nil
	})
	if err != nil {
		return nil, 0, nil, err
	}
	return a, ptr, b.Stream(), nil
}

// takeToResize is take for a Grow or Shrink, which also refuse to move or
// unmap b's memory while a Hold (a DLPack export, say) lends it out: the
// early, cheap answer. A Hold taken after it is caught by b.Disown (see
// takeOver).
func (r *Resource) takeToResize(op string, b *buffer.Buffer) (*allocation, cuda.DevicePtr, *cuda.Stream, error) {
	a, ptr, s, err := r.take(op, b)
	if err != nil {
		return nil, 0, nil, err
	}
	if n := b.Holds(); n > 0 {
		return nil, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is held by %d Hold(s) (a DLPack export, say): release them before it is moved or unmapped", b, n)
	}
	return a, ptr, s, nil
}

// live reports, under r.mu, whether a is still filed under ptr and usable.
func (r *Resource) live(op string, ptr cuda.DevicePtr, a *allocation) error {
	if r.allocs[ptr] != a {
		return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	return nil
}

// useLive runs f with b held open and r.mu held, once it has checked that
// a (from take) is still b's allocation. Without the check, a Close (or a
// Grow that moved a) between take and r.mu would have f read an
// allocation that Deallocate is freeing outside r.mu, or hand its
// released handles to the driver. Holding b open (b.Use) also orders f
// against b's whole life: a Close, or the Disown of a Grow or Shrink,
// waits until f returns, so whatever f reports (an export, say) was true
// of an open buffer. f must not call b's methods.
func (r *Resource) useLive(op string, b *buffer.Buffer, a *allocation, f func() error) error {
	return b.Use(op, func(ptr cuda.DevicePtr) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := r.live(op, ptr, a); err != nil {
			return err
		}
		// b.Use passed before a Sleep, Wake, Grow or Shrink claimed a
		// (or before a Sleep ended): a's memory is theirs, or gone.
		if err := a.refuseChanging(op); err != nil {
			return err
		}
		return f()
	})
}

// refuseChanging refuses a call on a while a claim is changing its memory
// (Grow, Shrink, Sleep, Wake) or after a Sleep released it. Called with
// r.mu held.
func (a *allocation) refuseChanging(op string) error {
	if a.sleep != nil {
		return &cuda.OpError{Op: op, Err: &AsleepError{Tag: a.tag, Addr: a.base, Size: a.size}}
	}
	if a.claimed {
		return errResizing(op, a.base)
	}
	return nil
}

// withLive is take then useLive: it runs f on b's allocation with b held
// open and r.mu held.
func (r *Resource) withLive(op string, b *buffer.Buffer, f func(a *allocation) error) error {
	a, _, _, err := r.take(op, b)
	if err != nil {
		return err
	}
	return r.useLive(op, b, a, func() error { return f(a) })
}

// beginResize claims a for one Grow or Shrink, under r.mu: until the
// claim ends, the calls that could change a (another Grow or Shrink,
// SetPeerAccess) are refused, so a failed takeOver can still put
// everything back. A Deallocate meanwhile is left to the claim's end
// (allocation.freeLater).
func (r *Resource) beginResize(op string, ptr cuda.DevicePtr, a *allocation) error {
	if err := r.live(op, ptr, a); err != nil {
		return err
	}
	if err := a.refuseChanging(op); err != nil {
		return err
	}
	a.claimed = true
	return nil
}

func errResizing(op string, ptr cuda.DevicePtr) error {
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "allocation %#x is being changed by another call (Grow, Shrink, Sleep or Wake; Grow and Shrink consume their buffer: do not use it concurrently)", uint64(ptr))
}

// endResizeLocked drops the claim of beginResize, under r.mu. If a
// Deallocate came meanwhile (a.freeLater), it takes a, as it was before
// the claim, out of r.allocs and returns it, for the caller to free with
// freeLeft once r.mu is released. Otherwise it returns nil.
func (r *Resource) endResizeLocked(a *allocation) (toFree *allocation) {
	a.claimed = false
	if !a.freeLater {
		return nil
	}
	a.freeLater = false
	delete(r.allocs, a.base)
	return a
}

// abortResize ends a Grow or Shrink (described by what) that did not
// happen, for the reason err, once what it prepared is given back: it
// drops the claim (r.mu is held on entry and released on return) and, if
// the allocation's free was left to it meanwhile, frees it.
func (r *Resource) abortResize(a *allocation, what string, err error) error {
	toFree := r.endResizeLocked(a)
	r.mu.Unlock()
	if toFree == nil {
		return fmt.Errorf("%s (not done: the allocation is as it was): %w", what, err)
	}
	return fmt.Errorf("%s (not done, and the memory freed: the buffer was closed meanwhile, and its free left to this call): %w", what, errors.Join(err, r.freeLeft(toFree)))
}

// takeOver takes b over (b.Disown) for a Grow or Shrink, unless err
// already failed it, and returns with r.mu held. A Deallocate of a that
// came meanwhile cannot have come from b (a closed b cannot be taken
// over), so it came from a caller of Deallocate that gave the memory up
// behind b's back: that Deallocate returned nil, so the memory is freed,
// not resized.
func (r *Resource) takeOver(op string, b *buffer.Buffer, a *allocation, ptr cuda.DevicePtr, err error) error {
	if err == nil {
		_, _, err = b.Disown()
	}
	r.mu.Lock()
	if err == nil && a.freeLater {
		err = cuda.Errorf(op, cuda.ErrClosed, "allocation %#x was freed (Deallocate) while being resized", uint64(ptr))
	}
	return err
}

// Grow returns a buffer of newSize bytes holding b's data, and closes b
// (without freeing). The pointer stays the same unless the address space
// after the allocation is taken; no data is copied either way. When the
// allocation must move, Grow first waits for b's stream (nil: the legacy
// default stream), so work already submitted on it is done before the old
// addresses are unmapped. A newSize not above b's size returns b unchanged.
//
// Grow consumes b: a SetPeerAccess, Grow or Shrink of b meanwhile is
// refused. The new memory is prepared first, and b taken over (b.Disown)
// only before anything of the old allocation changes, so a Hold of b
// taken meanwhile (a DLPack export on another goroutine) makes the grow
// fail and be undone. A Close of b meanwhile is neither refused nor made
// to wait: it wins, and returns nil; Grow undoes its work, frees the
// memory, once (what the driver refuses is in its error and kept for
// Reclaim), and returns a nil buffer with an error matching
// cuda.ErrClosed. So does the release of the last Hold of a b closed
// while held: Release leaves the free to Grow and returns nil.
//
// Otherwise an error with a nil buffer means the grow did not happen and
// b is untouched: open, at its address, every byte mapped. A non-nil
// buffer with an error means the grow took effect (use and close the
// returned buffer), but the old range after a move, or a range the driver
// granted at the wrong address, could not be given back: it is kept for
// Reclaim, and the error wraps buffer.ErrPartlyFreed.
func (r *Resource) Grow(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	const op = "Resource.Grow"
	a, oldPtr, s, err := r.takeToResize(op, b)
	if err != nil {
		return nil, err
	}
	if newSize <= b.Size() {
		return b, nil
	}
	need, err := r.roundUp(op, newSize)
	if err != nil {
		return nil, err
	}
	r.retryLeftovers()
	// Before r.mu: Buffer locks are never taken under r.mu.
	what := fmt.Sprintf("%s %#x from %d to %d bytes", op, uint64(oldPtr), b.Size(), newSize)
	r.mu.Lock()
	if err := r.beginResize(op, oldPtr, a); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	g := &growth{need: need}
	g.t.start()
	if need > a.mapped {
		if err := r.extend(a, s, g); err != nil {
			// r.mu was held since beginResize: no free was left to us.
			a.claimed = false
			r.mu.Unlock()
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	r.mu.Unlock()
	// The new memory is ready and the old allocation untouched. If b
	// cannot be taken over (a Hold came, or b was closed), give the new
	// memory back, so the allocation is as it was.
	if err := r.takeOver(op, b, a, oldPtr, nil); err != nil {
		err = r.rollback(&g.t, err)
		return nil, r.abortResize(a, what, errors.Join(err, g.stray))
	}
	cleanup := r.commitGrow(a, g)
	if a.base != oldPtr { // moved: file a under its new base
		delete(r.allocs, oldPtr)
		r.allocs[a.base] = a
	}
	a.size = newSize
	a.claimed = false // no free was left to it (freeLater checked above, under r.mu since)
	base := a.base
	r.mu.Unlock()
	nb := buffer.Owned(base, newSize, r, s)
	if cleanup != nil {
		return nb, fmt.Errorf("%s %#x to %d bytes (done, now at %#x): %w: %w", op, uint64(oldPtr), newSize, uint64(base), buffer.ErrPartlyFreed, cleanup)
	}
	return nb, nil
}

// growth is a Grow prepared but not yet part of its allocation: the new
// memory is mapped and accessible (a chunk after the allocation, or a
// whole new range that maps the old chunks too), and t records all of it,
// so that a Grow that cannot take its buffer over gives it back and leaves
// the allocation exactly as it was.
type growth struct {
	t    txn
	need uint64 // the mapped size after the grow

	h     cuda.MemHandle // the new chunk, mapped at the allocation's offset mapped
	grown *span          // in place: address space reserved after the allocation's

	moved   bool           // a new range holds everything: the allocation moves there
	np      cuda.DevicePtr // the new range
	reserve uint64         // its size

	// stray reports a range the driver granted at the wrong address that
	// could not be given back (kept for a retry): reported with the
	// outcome of the grow.
	stray error
}

// extend prepares g: memory so that a covers g.need bytes, in place if the
// address space after a can be had, else in a new range (remap). Called
// with r.mu held; a does not change. On error nothing is left of g.
func (r *Resource) extend(a *allocation, s *cuda.Stream, g *growth) error {
	add := g.need - a.mapped
	reserved := a.resv
	if g.need > reserved {
		// Ask for the address space right after ours.
		extra := g.need - reserved
		hint := a.base + cuda.DevicePtr(reserved)
		if uint64(hint)+extra < uint64(hint) {
			return r.remap(a, s, g) // no room before the top of the address space
		}
		p, err := r.drv.MemAddressReserve(extra, r.gran, hint)
		if err != nil {
			// Not granted: moving is the designed fallback, and its own
			// failure is what the caller hears about.
			return r.remap(a, s, g)
		}
		if p != hint {
			// Granted elsewhere: of no use, so give it back and move. A
			// failure to free it is kept for a retry and reported with
			// the outcome of the grow.
			if ferr := r.drv.MemAddressFree(p, extra); ferr != nil {
				r.left.keep(&leftovers{spans: []span{{p, extra}}})
				g.stray = fmt.Errorf("freeing the %d bytes of address space granted at %#x instead of %#x: %w (kept for a retry)", extra, uint64(p), uint64(hint), ferr)
			}
			if err := r.remap(a, s, g); err != nil {
				return errors.Join(err, g.stray)
			}
			return nil
		}
		g.t.reserved(p, extra)
		g.grown = &span{p, extra}
	}
	h, err := r.newChunk(&g.t, a.base+cuda.DevicePtr(a.mapped), add, a.descs)
	if err != nil {
		return r.rollback(&g.t, err)
	}
	g.h = h
	return nil
}

// remap prepares g as the allocation built again in a new range of g.need
// bytes: the old chunks are mapped there too (the same physical memory:
// nothing is copied), a new chunk fills the rest, and access is set on the
// whole new range at once. So a move costs one map per chunk plus a
// constant, no more than remapping the chunks. The old range is left as it
// is (commitGrow gives it back). Called with r.mu held; on error nothing
// is left of g.
func (r *Resource) remap(a *allocation, s *cuda.Stream, g *growth) error {
	need := g.need
	reserve := max(need, r.reserve)
	np, err := r.reserveRange(&g.t, reserve, 0)
	if err != nil {
		return r.rollback(&g.t, err)
	}
	for _, c := range a.chunks {
		at := np + cuda.DevicePtr(c.off)
		if err := r.drv.MemMap(at, c.size, 0, c.h); err != nil {
			return r.rollback(&g.t, err)
		}
		g.t.mapped(at, c.size)
	}
	h, err := r.drv.MemCreate(need-a.mapped, &r.prop)
	if err != nil {
		return r.rollback(&g.t, err)
	}
	g.t.created(h)
	at := np + cuda.DevicePtr(a.mapped)
	if err := r.drv.MemMap(at, need-a.mapped, 0, h); err != nil {
		return r.rollback(&g.t, err)
	}
	g.t.mapped(at, need-a.mapped)
	if err := r.drv.MemSetAccess(np, need, a.descs...); err != nil {
		return r.rollback(&g.t, err)
	}
	// The new range is complete. Work already submitted may still use the
	// old addresses: let it finish before they go. (Waited for here, while
	// the grow can still be undone: once b is disowned nothing may fail.)
	if err := r.wait("Resource.Grow", s); err != nil {
		return r.rollback(&g.t, err)
	}
	g.h, g.moved, g.np, g.reserve = h, true, np, reserve
	return nil
}

// commitGrow makes g part of a, once the Grow owns its buffer, and
// returns what could not be given back (kept for a retry): after a move,
// the old range; a stray range from extend. Nothing here can undo the
// grow. Called with r.mu held.
func (r *Resource) commitGrow(a *allocation, g *growth) (cleanup error) {
	if g.need <= a.mapped {
		return nil // the grow fit in what was mapped: only the size changes
	}
	if g.moved {
		// The handles now belong to the new range; the old range holds
		// only its mappings (chunks back to back from its base) and
		// address space.
		old := leftovers{maps: []span{{a.base, a.mapped}}, spans: a.reservations}
		if rerr := reap(r.drv, &old); rerr != nil {
			cleanup = fmt.Errorf("giving back the old range at %#x: %w (kept for a retry)", uint64(a.base), rerr)
		}
		r.left.keep(&old)
		a.base = g.np
		a.setReservations([]span{{g.np, g.reserve}})
	} else if g.grown != nil {
		a.reservations = append(a.reservations, *g.grown)
		a.resv += g.grown.size
	}
	a.chunks = append(a.chunks, chunk{off: a.mapped, size: g.need - a.mapped, h: g.h})
	a.mapped = g.need
	return errors.Join(cleanup, g.stray)
}

// Shrink returns a buffer of newSize bytes holding the start of b's data,
// and closes b (without freeing). Whole chunks past the new size are
// unmapped and released; the address space stays reserved, so a later
// Grow back is in place. A newSize not below b's size returns b unchanged.
// Before unmapping anything it waits for b's stream (nil: the legacy
// default stream); a shrink that stays within the last chunk unmaps
// nothing and waits for nothing.
//
// Shrink consumes b as Grow does, with the same answers to a concurrent
// use, Hold or Close of b (a Close wins: Shrink frees the whole
// allocation). It takes b over before it unmaps anything, so no holder is
// ever left with memory unmapped under it. An error with a nil buffer
// means the shrink did not happen and b is untouched. A non-nil buffer
// with an error means the shrink took effect, but some chunks past the
// new size could not be given back: they stay mapped in the allocation
// (Info counts them; a later Shrink or Close frees them) or are kept for
// Reclaim, and the error wraps buffer.ErrPartlyFreed.
func (r *Resource) Shrink(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	const op = "Resource.Shrink"
	a, oldPtr, s, err := r.takeToResize(op, b)
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
	what := fmt.Sprintf("%s %#x from %d to %d bytes", op, uint64(oldPtr), b.Size(), newSize)
	need, _ := roundUp(newSize, r.gran) // below b's size, which was rounded up once already
	r.mu.Lock()
	if err := r.beginResize(op, oldPtr, a); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	// Keep the chunks that start below need: chunk 0 always (need > 0).
	// The claim keeps a.chunks as they are until the shrink ends.
	i := sort.Search(len(a.chunks), func(i int) bool { return a.chunks[i].off >= need })
	unmaps := i < len(a.chunks)
	r.mu.Unlock()
	// Nothing has changed so far: a failure up to the take-over leaves
	// the allocation as it was. The wait (for unmapping) is outside r.mu.
	if unmaps {
		err = r.wait(op, s)
	}
	if err := r.takeOver(op, b, a, oldPtr, err); err != nil {
		return nil, r.abortResize(a, what, err)
	}
	// b is gone, so the shrink takes effect whatever the driver does: the
	// size shrinks, so nothing can address a chunk past it. A chunk that
	// will not unmap stays mapped in the allocation (unmapFrom keeps what
	// is mapped a prefix), counted in Info, freed by Close.
	k, err := r.unmapFrom(a, i)
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
	a.claimed = false // no free was left to it (freeLater checked above, under r.mu since)
	base, mapped := a.base, a.mapped
	r.mu.Unlock()
	nb := buffer.Owned(base, newSize, r, s)
	if err != nil {
		return nb, fmt.Errorf("%s (done; %d bytes still mapped): %w: %w", what, mapped, buffer.ErrPartlyFreed, err)
	}
	return nb, nil
}
