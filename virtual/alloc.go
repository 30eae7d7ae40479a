package virtual

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// newChunk creates size bytes of physical memory and maps it at ptr with
// the given access, recording each step in t for a rollback.
func (r *Resource) newChunk(t *txn, ptr cuda.DevicePtr, size uint64, descs []cuda.MemAccessDesc) (cuda.MemHandle, error) {
	h, err := r.drv.MemCreate(size, &r.prop)
	if err != nil {
		return 0, err
	}
	t.created(h)
	if err := r.drv.MemMap(ptr, size, 0, h); err != nil {
		return 0, err
	}
	t.mapped(ptr, size)
	if err := r.drv.MemSetAccess(ptr, size, descs...); err != nil {
		return 0, err
	}
	return h, nil
}

// reserveRange reserves size bytes of address space for a new range (an
// allocation, an import, or the range a moving Grow builds) and records it
// in t. It asks for the granularity as the alignment (or AddrAlign, where
// that is more), as the C baseline does: every mapping must start on a
// granule, and alignment 0 (the driver's default) made the allocate+close
// cycle about twice as slow. A range the driver put off the alignment
// anyway is given back (kept as a leftover if that fails) and the
// reservation fails.
func (r *Resource) reserveRange(t *txn, size uint64, hint cuda.DevicePtr) (cuda.DevicePtr, error) {
	p, err := r.drv.MemAddressReserve(size, r.align, hint)
	if err != nil {
		return 0, err
	}
	if uint64(p)%r.align != 0 {
		err := cuda.Errorf("cuMemAddressReserve", cuda.ErrorUnknown, "the driver reserved %d bytes at %#x, off the alignment %d it was asked for", size, uint64(p), r.align)
		if ferr := r.drv.MemAddressFree(p, size); ferr != nil {
			r.left.keep(&leftovers{spans: []span{{p, size}}})
			err = errors.Join(err, fmt.Errorf("giving the range back: %w (kept for a retry)", ferr))
		}
		return 0, err
	}
	t.reserved(p, size)
	return p, nil
}

// retryLeftovers gives back what earlier failed cleanups could not. It is
// best effort by design: whatever fails again stays recorded for the next
// operation, and Reclaim reports it, so an unrelated operation is not
// failed by an old leftover.
func (r *Resource) retryLeftovers() {
	_ = r.left.retry(r.drv)
}

// Reclaim retries giving back the driver resources (mappings, physical
// memory, address ranges) that the cleanup of an earlier failed operation
// could not give back, and reports what still fails. Every operation
// retries them by itself; Reclaim is for callers (and tests) that want to
// know. It returns nil when nothing is pending.
func (r *Resource) Reclaim() error {
	if err := r.check("Resource.Reclaim"); err != nil {
		return err
	}
	if err := r.left.retry(r.drv); err != nil {
		return &cuda.OpError{Op: "Resource.Reclaim", Err: err}
	}
	return nil
}

// Allocate maps size bytes (rounded up to the granularity; the Buffer has
// exactly size bytes). The stream only becomes the buffer's stream: mapping
// is synchronous. Size 0 returns an empty buffer. On error nothing is left
// allocated.
func (r *Resource) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the base address (0 for size 0) and s, the stream Close frees on.
func (r *Resource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if err := r.check("Resource.Allocate"); err != nil {
		return 0, nil, err
	}
	return r.allocate(size, s, r.opts.Tag)
}

// allocate is AllocatePtr with the allocation in tag.
func (r *Resource) allocate(size uint64, s *cuda.Stream, tag string) (cuda.DevicePtr, *cuda.Stream, error) {
	const op = "Resource.Allocate"
	if err := r.check(op); err != nil {
		return 0, nil, err
	}
	// Mapping is synchronous, not stream-ordered: captured, it would be
	// done once now rather than at each launch of the graph.
	if err := s.RefuseCapture(op); err != nil {
		return 0, nil, err
	}
	if size == 0 {
		return 0, s, nil
	}
	aligned, err := r.roundUp(op, size)
	if err != nil {
		return 0, nil, err
	}
	reserve := max(aligned, r.reserve)
	if hint := uint64(r.opts.AddrHint); hint != 0 && hint+reserve < hint {
		return 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "address hint %#x plus %d bytes overflows", hint, reserve)
	}
	r.retryLeftovers()
	var t txn
	t.start()
	ptr, err := r.reserveRange(&t, reserve, r.opts.AddrHint)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %d bytes: %w", op, size, err)
	}
	// Chunks share the resource's access list; setDesc copies before it
	// changes one allocation's.
	descs := r.descs
	h, err := r.newChunk(&t, ptr, aligned, descs)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %d bytes: %w", op, size, r.rollback(&t, err))
	}
	a := &allocation{base: ptr, size: size, mapped: aligned, reservations: []span{{ptr, reserve}}, resv: reserve,
		chunks: []chunk{{off: 0, size: aligned, h: h}}, descs: descs, tag: tag}
	r.mu.Lock()
	r.allocs[ptr] = a
	r.mu.Unlock()
	return ptr, s, nil
}

// Deallocate waits for s (nil: the legacy default stream; work on other
// streams is the caller's to order), then unmaps the allocation, releases
// every physical chunk and frees its address space.
//
// If that fails before anything was given back, the allocation is left as
// it was: the buffer stays open and Close can be retried. Once a chunk is
// unmapped there is no way back (mapping it again can fail too, and a
// buffer must never stay open over unmapped memory: on a real GPU a stray
// access poisons the context), so Deallocate finishes: the allocation is
// removed, what the driver refuses to give back is kept for Reclaim
// (never released twice), and the error wraps buffer.ErrPartlyFreed,
// which makes the buffer close anyway.
//
// A Deallocate while a Grow or Shrink owns the allocation is the free of
// the buffer that call is consuming: it waits for s as always (if that
// fails, nothing changes), records the free and returns nil, and the Grow
// or Shrink frees the allocation once it has undone its own work (see
// Resource.Grow). Until then the allocation still counts in Live, and a
// second Deallocate of it is refused.
func (r *Resource) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "Resource.Deallocate"
	if err := r.check(op); err != nil {
		return err
	}
	if ptr == 0 {
		return nil
	}
	// The free waits for s, which a capture forbids: refuse it before
	// anything changes, so the buffer stays open and the capture valid.
	if err := s.RefuseCapture(op); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays allocated)", err, uint64(ptr), size)
	}
	waited := false
	r.mu.Lock()
	a := r.allocs[ptr]
	for a != nil {
		if a.size != size {
			// A free of the wrong size is a caller's mistake about what
			// ptr is: refuse it, leaving the allocation (and its buffer)
			// intact.
			r.mu.Unlock()
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x is an allocation of %d bytes, not %d", uint64(ptr), a.size, size)
		}
		if !a.claimed {
			break
		}
		if a.freeLater {
			r.mu.Unlock()
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) is freed already (the free waits for the end of the Grow or Shrink that owns it)", uint64(ptr), size)
		}
		if waited {
			// A Grow or Shrink owns it and may still have to put it back
			// as it was: it frees it as it ends (see endResizeLocked).
			a.freeLater = true
			r.mu.Unlock()
			return nil
		}
		// Wait first, outside r.mu, as an ordinary free does: its
		// failure leaves the buffer open (or the Hold live) for a retry,
		// and the Grow or Shrink need not wait for anything to free.
		r.mu.Unlock()
		if err := r.wait(op, s); err != nil {
			return fmt.Errorf("%s %#x (nothing freed; the buffer is intact): %w", op, uint64(ptr), err)
		}
		waited = true
		// Look again: the Grow or Shrink may have ended meanwhile.
		r.mu.Lock()
		a = r.allocs[ptr]
	}
	if a == nil {
		r.mu.Unlock()
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) is not an allocation of this resource", uint64(ptr), size)
	}
	delete(r.allocs, ptr)
	r.mu.Unlock()
	var err error
	if !waited {
		err = r.wait(op, s)
	}
	freed := false
	if err == nil {
		freed, err = r.free(a)
	}
	if err == nil {
		return nil
	}
	if freed {
		return fmt.Errorf("%s %#x: %w (what was not given back is kept for a retry; see Reclaim): %w", op, uint64(ptr), buffer.ErrPartlyFreed, err)
	}
	// Nothing was given back: file it again, so the buffer stays usable
	// and Close can be retried.
	r.mu.Lock()
	r.allocs[ptr] = a
	r.mu.Unlock()
	return fmt.Errorf("%s %#x (nothing freed; the buffer is intact): %w", op, uint64(ptr), err)
}

// freeLeft frees a, whose free a Deallocate left to the Grow or Shrink
// that owned it (freeLater), once a is out of r.allocs (endResizeLocked).
// Deallocate waited for the stream already. No buffer is left to retry a
// Close, so if the driver refuses the first unmap, all of a is handed to
// the leftovers instead. It returns nil once all of a is given back.
// Called without r.mu.
func (r *Resource) freeLeft(a *allocation) error {
	ptr := a.base
	freed, err := r.free(a)
	if err == nil {
		return nil
	}
	if !freed {
		// a is whole: give it up whole.
		rerr := r.giveUp(a, len(a.chunks))
		if rerr == nil {
			return nil // given back on the second try
		}
		err = errors.Join(err, rerr)
	}
	return fmt.Errorf("freeing %#x, which a Close or a Hold's Release left to this call: %w (what was not given back is kept for a retry; see Reclaim)", uint64(ptr), err)
}

// wait lets the work submitted to s (nil: the legacy default stream) finish
// before memory it may use is unmapped. It waits for that stream only,
// never for the whole device: work on other streams is the caller's to
// order, as for any free.
func (r *Resource) wait(op string, s *cuda.Stream) error {
	s, err := r.dev.ResolveStream(op, s, false)
	if err != nil {
		return err
	}
	return r.drv.syncStream(s)
}

// mapChunk maps c at base+c.off with the access descs. If the access
// cannot be set it unmaps c again, so c ends either fully mapped or not
// mapped at all; a mapping that will not go is kept as a leftover.
func (r *Resource) mapChunk(base cuda.DevicePtr, c chunk, descs []cuda.MemAccessDesc) error {
	at := base + cuda.DevicePtr(c.off)
	if err := r.drv.MemMap(at, c.size, 0, c.h); err != nil {
		return err
	}
	if err := r.drv.MemSetAccess(at, c.size, descs...); err != nil {
		if uerr := r.drv.MemUnmap(at, c.size); uerr != nil {
			r.left.keep(&leftovers{maps: []span{{at, c.size}}})
			return errors.Join(err, fmt.Errorf("unmapping it again: %w (kept for a retry)", uerr))
		}
		return err
	}
	return nil
}

// unmapFrom unmaps a.chunks[i:], the last first, and returns i. If an
// unmap fails, the chunks this call already unmapped are mapped again,
// lowest first, so a is exactly as it was: it then returns len(a.chunks)
// and the error. Only if that also fails does it return some k in
// [i, len(a.chunks)) with the error: a.chunks[:k] are mapped and
// a.chunks[k:] are not (what is mapped is always a prefix).
func (r *Resource) unmapFrom(a *allocation, i int) (int, error) {
	for j := len(a.chunks) - 1; j >= i; j-- {
		c := a.chunks[j]
		err := r.drv.MemUnmap(a.base+cuda.DevicePtr(c.off), c.size)
		if err == nil {
			continue
		}
		err = fmt.Errorf("unmapping the chunk at offset %d: %w", c.off, err)
		for k := j + 1; k < len(a.chunks); k++ {
			if rerr := r.mapChunk(a.base, a.chunks[k], a.descs); rerr != nil {
				return k, errors.Join(err, fmt.Errorf("mapping the chunk at offset %d again: %w", a.chunks[k].off, rerr))
			}
		}
		return len(a.chunks), err
	}
	return i, nil
}

// free unmaps and releases everything a holds. If the first unmap fails
// (and the chunks unmapped before it are mapped again), nothing changed:
// it returns freed == false and a is whole. Otherwise a is past the point
// of no return and freed is true: every step is tried, and whatever the
// driver refuses (mappings, handles, address ranges) moves to r.left, so
// a itself holds nothing any more and nothing is released twice.
func (r *Resource) free(a *allocation) (freed bool, err error) {
	// Leftovers may sit in a's address space: a mapping a failed unmap
	// left there keeps it from being freed, asleep or not.
	r.retryLeftovers()
	if a.sleep != nil {
		// Nothing of a's own is mapped: only the address space (and the
		// backup) go.
		serr := r.forgetSleep(a)
		return true, errors.Join(serr, r.giveUp(a, 0))
	}
	k, err := r.unmapFrom(a, 0)
	if err != nil && k == len(a.chunks) {
		return false, err // nothing changed: a is still whole and usable
	}
	// a.chunks[:k] are still mapped (k is 0 unless mapping back failed
	// after a failed unmap); the rest are unmapped.
	return true, errors.Join(err, r.giveUp(a, k))
}

// giveUp empties a (its first mapped chunks still mapped, the rest not)
// and reaps what it held: unmaps, then every handle, then the address
// space once nothing is mapped in it. What fails moves to r.left.
func (r *Resource) giveUp(a *allocation, mapped int) error {
	var l leftovers
	for i, c := range a.chunks {
		if i < mapped {
			l.maps = append(l.maps, span{a.base + cuda.DevicePtr(c.off), c.size})
		}
		l.handles = append(l.handles, c.h)
	}
	l.spans = append(l.spans, a.reservations...)
	a.chunks, a.mapped = nil, 0
	a.setReservations(nil)
	err := reap(r.drv, &l)
	r.left.keep(&l)
	return err
}
