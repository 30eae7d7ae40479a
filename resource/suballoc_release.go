package resource

// SubAllocator: growth from the upstream, and giving blocks back (Trim,
// Close, and Deallocate after Close).

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// growLocked takes a block of want bytes (at least n) from the upstream on
// s and adds it to l. Within MaxSize, want shrinks to what is left; if the
// upstream refuses want it is asked for n alone.
func (a *SubAllocator) growLocked(op string, l *subList, n, want uint64, s *cuda.Stream) error {
	extra := a.alignExtra()
	// n and want are multiples of the alignment, and extra is less than
	// it, so the sums below cannot overflow.
	want = max(want, n)
	if a.max != 0 {
		if n+extra > a.max {
			// No new block can hold the request, whatever is given
			// back: no trim is made for it. Only past MaxSize itself is
			// it marked neverFits (no retry at all): below, a block
			// already held whose start happens to be aligned may hold
			// it once its allocations are freed.
			var err error = fmt.Errorf("%d bytes on %s: a block for them takes %d bytes, more than MaxSize %d (%d reserved, %d of it free): %w",
				n, streamName(s), n+extra, a.max, a.held, a.freeBytesLocked(), cuda.ErrorOutOfMemory)
			if n > a.max {
				err = neverFits{err}
			}
			return &cuda.OpError{Op: op, Err: err}
		}
		left := a.max - min(a.max, a.held)
		if n+extra > left {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes on %s: a new block of %d bytes would exceed MaxSize %d (%d reserved, %d of it free in ranges too small or fragmented): %w",
				n, streamName(s), n+extra, a.max, a.held, a.freeBytesLocked(), cuda.ErrorOutOfMemory)}
		}
		want = min(want, left-extra)
	}
	var err error
	for _, size := range []uint64{want + extra, n + extra} {
		var ub *buffer.Buffer
		ub, err = buffer.Allocate(a.up, size, s)
		if err == nil {
			return a.addBlockLocked(op, l, ub, size, n)
		}
		if size == n+extra || !errors.Is(err, cuda.ErrorOutOfMemory) {
			break
		}
	}
	return &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes on %s: grow from %v: %w", n, streamName(s), a.up, err)}
}

// alignExtra is how much more than a block's size is asked of the
// upstream, to align the block's start.
func (a *SubAllocator) alignExtra() uint64 {
	if a.align > subUpstreamAlign {
		return a.align - subUpstreamAlign
	}
	return 0
}

// addBlockLocked adds the upstream buffer ub (of size bytes, asked for to
// hold n) as a block whose aligned range is free on l.
func (a *SubAllocator) addBlockLocked(op string, l *subList, ub *buffer.Buffer, size, n uint64) error {
	base, got := uint64(ub.Ptr()), ub.Size()
	if got != size || base == 0 {
		return a.rejectBlock(op, ub, fmt.Errorf("upstream %v returned %#x (%d bytes) for a request of %d bytes", a.up, base, got, size))
	}
	// A hostile or broken upstream may return a range that wraps past
	// 2^64: it is refused, never carved.
	if base+size < base {
		return a.rejectBlock(op, ub, fmt.Errorf("upstream %v returned %#x (%d bytes), a range that wraps past the end of the address space", a.up, base, size))
	}
	start, ok := alignUp(base, a.align)
	end := (base + size) &^ (a.align - 1)
	if !ok || start >= end || end-start < n {
		return a.rejectBlock(op, ub, fmt.Errorf("upstream %v returned %#x (%d bytes), which cannot hold %d bytes aligned to %d", a.up, base, size, n, a.align))
	}
	b := &subBlock{buf: ub, base: base, size: size}
	if err := a.acquireNew(op, b); err != nil {
		return err
	}
	b.id = tableAdd(&a.blockTab, &a.freeBlk, b)
	i := a.newChunk()
	c := &a.chunks[i]
	c.addr, c.size, c.blk = start, end-start, b.id
	b.first = i
	at, _ := slices.BinarySearchFunc(a.blocks, base, func(x *subBlock, v uint64) int { return cmp.Compare(x.base, v) })
	a.blocks = slices.Insert(a.blocks, at, b)
	a.held += size
	a.peak = max(a.peak, a.held)
	a.freeLocked(l, i)
	return nil
}

// acquireNew runs the Acquired hook for b, a block just taken from the
// upstream and not yet in the books. If the hook fails, or panics, the
// block goes back to the upstream (a panic then goes on to the caller),
// so that nothing is held that the books do not know.
func (a *SubAllocator) acquireNew(op string, b *subBlock) error {
	returned := false
	defer func() {
		if !returned {
			// The hook's panic is what the caller sees; a failure to
			// give the block back now is left to the safety net.
			_ = b.buf.Close()
		}
	}()
	err := a.acquired(b)
	returned = true
	if err != nil {
		err = &cuda.OpError{Op: op, Err: err}
		if cerr := b.buf.Close(); cerr != nil {
			return errors.Join(err, fmt.Errorf("give the block back: %w", cerr))
		}
	}
	return err
}

// rejectBlock gives back an upstream buffer that cannot serve as a block
// and returns the reason, matching cuda.ErrInvalidArgument, joined with
// the error of giving it back if that failed.
func (a *SubAllocator) rejectBlock(op string, ub *buffer.Buffer, why error) error {
	err := &cuda.OpError{Op: op, Err: fmt.Errorf("%w: %w", cuda.ErrInvalidArgument, why)}
	if cerr := ub.Close(); cerr != nil {
		return errors.Join(err, fmt.Errorf("give the buffer back: %w", cerr))
	}
	return err
}

// subRelease is a block detached from the free lists, to be given back to
// the upstream without the lock held: waiting for streams may take long.
type subRelease struct {
	blk     *subBlock
	keys    []*cuda.Stream // the stream of each chunk, in address order, to put them back
	streams []*cuda.Stream // the distinct streams among keys
}

// detachLocked takes a block without live allocations out of the free
// lists, remembering each chunk's stream so that a failed release can put
// them back (the lists themselves may be gone by then).
func (a *SubAllocator) detachLocked(b *subBlock) subRelease {
	b.releasing = true
	a.releasing++
	r := subRelease{blk: b}
	for i := b.first; i != 0; i = a.chunks[i].next {
		c := &a.chunks[i]
		l := a.listTab[c.list]
		a.unlink(l, i)
		l.n--
		l.bytes -= c.size
		c.list = 0
		r.keys = append(r.keys, l.key)
		if !slices.Contains(r.streams, l.key) {
			r.streams = append(r.streams, l.key)
		}
	}
	return r
}

// restoreLocked puts a detached block that was not given back on the
// lists again, each chunk on the stream it was free on: the block is
// exactly as it was before it was detached, still owned and usable.
func (a *SubAllocator) restoreLocked(r subRelease) {
	b := r.blk
	b.releasing = false
	a.releaseDoneLocked()
	// Chunks not yet put back are still off the lists, so each one merges
	// only with neighbours already back.
	k := 0
	for i := b.first; i != 0; k++ {
		next := a.chunks[i].next
		a.freeLocked(a.listFor(r.keys[k]), i)
		i = next
	}
}

// dropLocked forgets a detached block whose memory went back to the
// upstream.
func (a *SubAllocator) dropLocked(b *subBlock) {
	a.releaseDoneLocked()
	for i := b.first; i != 0; {
		next := a.chunks[i].next
		a.recycle(i)
		i = next
	}
	if i := slices.Index(a.blocks, b); i >= 0 {
		a.blocks = slices.Delete(a.blocks, i, i+1)
	}
	a.blockTab[b.id] = nil
	a.freeBlk = append(a.freeBlk, b.id)
	a.held -= b.size
}

// releaseDoneLocked ends the release of one detached block, waking a
// Close that waits for the last one.
func (a *SubAllocator) releaseDoneLocked() {
	if a.releasing--; a.releasing == 0 && a.released.L != nil {
		a.released.Broadcast()
	}
}

// subGiven is what giveBack gave back.
type subGiven struct {
	bytes  uint64 // bytes of the blocks given back (what Reserved dropped by)
	blocks int    // blocks given back
	kept   int    // blocks that could not be given back and are on the lists again
}

// giveBack returns the detached blocks rs to the upstream, without the
// lock, in two phases so that a failure changes as little as possible:
// it waits (on the host) for every stream that freed into the blocks, and
// if that fails every block goes back on the lists; then it frees the
// blocks one by one, and a block whose free fails goes back on the lists
// while the others go anyway (giving back is most wanted when memory is
// short), the errors joined.
//
// The hooks and the upstream are user code: if one panics, the blocks not
// yet dealt with (the one in hand included: a block is dropped only once
// its memory is gone) go back on the lists before the panic goes on, so
// that the books stay whole and Close does not wait for them forever.
func (a *SubAllocator) giveBack(rs []subRelease) (subGiven, error) {
	var g subGiven
	done := 0 // rs[done:] are still detached, and go back on the lists
	defer func() {
		if done < len(rs) {
			a.mu.Lock()
			for _, r := range rs[done:] {
				a.restoreLocked(r)
			}
			a.mu.Unlock()
		}
	}()
	var streams []*cuda.Stream
	var total uint64
	for _, r := range rs {
		total += r.blk.size
		for _, s := range r.streams {
			if !slices.Contains(streams, s) {
				streams = append(streams, s)
			}
		}
	}
	for _, s := range streams {
		if err := a.order.sync(s); err != nil {
			g.kept = len(rs) // the deferred restore puts every block back
			what := fmt.Sprintf("%d blocks (%d bytes)", len(rs), total)
			if len(rs) == 1 {
				what = fmt.Sprintf("%#x (%d bytes)", rs[0].blk.base, rs[0].blk.size)
			}
			return g, fmt.Errorf("give back %s to %v: wait for %s: %w", what, a.up, streamName(s), err)
		}
	}
	var errs []error
	for _, r := range rs {
		b := r.blk
		gone, err := a.freeBlock(r)
		a.mu.Lock()
		if gone {
			a.dropLocked(b)
			g.bytes += b.size
			g.blocks++
		} else {
			a.restoreLocked(r)
			g.kept++
		}
		done++
		a.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("give back %#x (%d bytes) to %v: %w", b.base, b.size, a.up, err))
		}
	}
	return g, errors.Join(errs...)
}

// freeBlock frees the upstream buffer of a detached block whose streams
// are idle. gone reports whether the memory went back to the upstream
// (possibly with an error about cleaning up after it, which must still be
// reported); when it is false the block is intact.
func (a *SubAllocator) freeBlock(r subRelease) (gone bool, err error) {
	b := r.blk
	if b.acquired {
		if err := a.segs.Released(cuda.DevicePtr(b.base), b.size); err != nil {
			return false, fmt.Errorf("segment hook Released: %w (the block stays)", err)
		}
		b.acquired = false
	}
	gone, err = a.freeBlockUp(r)
	if !gone && a.segs.Acquired != nil && !b.acquired {
		// The block stays after all: it is acquired again, as it was.
		if aerr := a.acquired(b); aerr != nil {
			err = errors.Join(err, aerr)
		}
	}
	return gone, err
}

// segmentHooks returns h with missing hooks as no-ops (nil: none).
func segmentHooks(h *SegmentHooks) SegmentHooks {
	if h == nil || h.Acquired == nil && h.Released == nil {
		return SegmentHooks{}
	}
	out := *h
	if out.Acquired == nil {
		out.Acquired = func(cuda.DevicePtr, uint64) error { return nil }
	}
	if out.Released == nil {
		out.Released = func(cuda.DevicePtr, uint64) error { return nil }
	}
	return out
}

// acquired runs the Acquired hook for block b, if there is one.
func (a *SubAllocator) acquired(b *subBlock) error {
	if a.segs.Acquired == nil {
		return nil
	}
	if err := a.segs.Acquired(cuda.DevicePtr(b.base), b.size); err != nil {
		return fmt.Errorf("segment hook Acquired for %#x (%d bytes): %w", b.base, b.size, err)
	}
	b.acquired = true
	return nil
}

// freeBlockUp gives a detached block's memory back to the upstream (see
// freeBlock).
func (a *SubAllocator) freeBlockUp(r subRelease) (gone bool, err error) {
	b := r.blk
	// Every stream involved is idle, so any stream orders the free: prefer
	// one that freed into the block, else the block's own.
	var on *cuda.Stream
	for _, s := range r.streams {
		if s != nil {
			on = s
			break
		}
	}
	err = b.buf.CloseOn(on)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, buffer.ErrPartlyFreed):
		// The upstream freed the memory but failed to tidy up after it:
		// the buffer is closed, the block is gone, the error stands.
		return true, err
	case !errors.Is(err, cuda.ErrClosed):
		// A real failure of the free: it is reported, never retried
		// elsewhere and swallowed.
		return false, err
	}
	// That stream was destroyed (its work has finished: see phase 1 of
	// giveBack): free on the upstream's default stream instead.
	ptr, size, derr := b.buf.Disown()
	if derr != nil {
		return false, errors.Join(err, derr)
	}
	gone, uerr := freeThrough(a.up, ptr, size, nil)
	if gone {
		return true, uerr
	}
	// Still the block's memory: own it again, so that a retry (and the
	// safety net) can free it.
	b.buf = buffer.Owned(ptr, size, a.up, nil)
	return false, errors.Join(err, uerr)
}

// collectLocked detaches every block without live allocations.
func (a *SubAllocator) collectLocked() []subRelease {
	var rs []subRelease
	for _, b := range a.blocks {
		if b.live == 0 && !b.releasing {
			rs = append(rs, a.detachLocked(b))
		}
	}
	return rs
}

// TrimError is the error of a Trim that failed after it began giving
// blocks back (it is wrapped in the returned error: use errors.As). A
// block whose release fails stays, owned and usable, and the others are
// given back anyway, so a Trim error may come with memory given back:
// exactly Bytes in Blocks blocks, by which SubAllocatorStats.Reserved and
// Blocks have dropped. Kept is the number of entirely free blocks that
// stayed.
type TrimError struct {
	Bytes  uint64 // bytes given back to the upstream
	Blocks int    // blocks given back
	Kept   int    // free blocks that could not be given back
	Err    error  // what failed
}

// Error is Err's message followed by what was given back (safe on nil and
// zero values, like every method of the package).
func (e *TrimError) Error() string {
	if e == nil {
		return "<nil>"
	}
	msg := "trim failed"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Blocks+e.Kept == 0 {
		return msg
	}
	return fmt.Sprintf("%s (gave back %d of %d free blocks, %d bytes)", msg, e.Blocks, e.Blocks+e.Kept, e.Bytes)
}

// Unwrap returns Err (nil for nil).
func (e *TrimError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// Trim gives back to the upstream every block in which nothing is
// allocated, after waiting (on the host) for the streams that freed into
// them, since their work may still use the memory; a destroyed stream is
// waited for by synchronizing its device. It also forgets the streams
// that hold no free range (and destroys their events), so that the
// sub-allocator does not keep destroyed streams alive.
//
// If waiting fails, nothing is given back; a block that cannot be given
// back stays (still usable) and the others go anyway. The error wraps a
// *TrimError that says what was given back, and every underlying error.
// After Close, Trim returns an error matching cuda.ErrClosed.
func (a *SubAllocator) Trim() error {
	_, err := a.trim()
	return err
}

// trim is Trim, also reporting the bytes it gave back (even when it
// fails), for the out-of-memory retry: Reserved also moves with other
// goroutines' calls.
func (a *SubAllocator) trim() (gave uint64, err error) {
	const op = "SubAllocator.Trim"
	if err := a.check("Trim"); err != nil {
		return 0, err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return 0, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	a.dropCachesLocked() // their free ranges back in the books, empty caches forgotten
	rs := a.collectLocked()
	var errs []error
	kept := a.streams[:0]
	for _, l := range a.streams {
		if l.n > 0 {
			kept = append(kept, l)
			continue
		}
		if err := a.order.forget(l.key); err != nil {
			// The orderer keeps what it could not drop: keep the list
			// too, so that the next Trim retries (and Close in any case).
			errs = append(errs, fmt.Errorf("forget %s: %w", streamName(l.key), err))
			kept = append(kept, l)
			continue
		}
		delete(a.lists, l.key)
		a.listTab[l.id] = nil
		a.freeList = append(a.freeList, l.id)
	}
	clear(a.streams[len(kept):])
	a.streams = kept
	a.last = nil
	a.mu.Unlock()
	g, err := a.giveBack(rs)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return g.bytes, &cuda.OpError{Op: op, Err: &TrimError{Bytes: g.bytes, Blocks: g.blocks, Kept: g.kept, Err: err}}
	}
	return g.bytes, nil
}

// Close gives every block back to the upstream (after waiting for the
// streams that freed into them) and destroys the sub-allocator's events;
// later Allocate and Trim calls return errors matching cuda.ErrClosed.
// It does not close the upstream. The blocks of allocations still live
// go back with their last Deallocate, and Close returns an error matching
// cuda.ErrorIllegalState that says how many there are. Every failure is
// reported, joined; what failed stays held, and Close is idempotent:
// called again it retries what failed.
func (a *SubAllocator) Close() error {
	const op = "SubAllocator.Close"
	if a == nil || a.up == nil {
		return nil
	}
	a.mu.Lock()
	var errs []error
	a.closed = true
	a.dropCachesLocked() // no fast path from now on; cached ranges back in the books
	// Releases other goroutines began (a Trim, the Deallocate of a
	// block's last allocation) end first, before the orderer they wait
	// with is closed: a block one of them fails to give back comes back
	// on the lists and is collected below with the rest, instead of
	// staying held after Close returned.
	for a.releasing > 0 {
		a.released.L = &a.mu
		a.released.Wait()
	}
	if !a.orderDone {
		// Retried by every Close until it succeeds: an event the driver
		// failed to destroy stays with the orderer until then.
		if err := a.order.close(); err != nil {
			errs = append(errs, err)
		} else {
			a.orderDone = true
		}
	}
	rs := a.collectLocked()
	// Releases that failed in Deallocate are retried now (their blocks
	// went back on the lists and are collected above); their old errors
	// are superseded by the retry's.
	a.deferred = nil
	a.mu.Unlock()
	if _, err := a.giveBack(rs); err != nil {
		errs = append(errs, err)
	}
	a.mu.Lock()
	if n := a.live.n; n > 0 {
		errs = append(errs, fmt.Errorf("%d allocations (%d bytes) are still live; their blocks are given back as they are deallocated: %w", n, a.used, cuda.ErrorIllegalState))
	}
	a.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	return nil
}
