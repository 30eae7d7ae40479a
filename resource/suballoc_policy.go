package resource

// SubAllocator: giving blocks back as they fall free (ReleasePolicy).

// ReleasePolicy makes a SubAllocator give a block back to its upstream
// as soon as the block's last allocation is freed, rather than keeping it
// until Trim or Close, so that the memory it holds follows the memory in
// use. Over an upstream whose blocks are physical memory mapped on demand
// (virtual.NewPool) that removes the cost every caching allocator pays:
// memory held but too fragmented to serve the next request.
//
// The zero value keeps nothing: every block that falls free goes back.
// Giving a block back waits on the host for the streams that freed into
// it (their work may still use it), so the Deallocate (Buffer.Close) that
// frees a block's last range returns after that work; memory kept
// free, up to KeepFree, spares the common case that wait and the
// upstream calls.
type ReleasePolicy struct {
	// KeepFree is how many bytes of entirely free blocks stay held for
	// reuse. Only blocks of at most GrowSize are kept: a larger block,
	// made for one large request, would be pinned whole by any small
	// allocation carved out of it later.
	KeepFree uint64
	// Threshold is the reserve below which nothing is given back, as the
	// driver pools' release threshold: while the SubAllocator holds at
	// most Threshold bytes, free blocks stay whatever their size.
	Threshold uint64
}

// fallenLocked picks the blocks the release policy gives back now that
// block b has fallen free, and detaches them (b first).
func (a *SubAllocator) fallenLocked(b *subBlock) []subRelease {
	p := a.release
	held := a.held
	if held <= p.Threshold {
		return nil
	}
	var free uint64
	for _, x := range a.blocks {
		if x.live == 0 && !x.releasing {
			free += x.size
		}
	}
	var rs []subRelease
	take := func(x *subBlock) {
		rs = append(rs, a.detachLocked(x))
		free -= x.size
		held -= x.size
	}
	if b.size > a.grow+a.alignExtra() || free > p.KeepFree {
		take(b)
	}
	for _, x := range a.blocks {
		if free <= p.KeepFree || held <= p.Threshold {
			break
		}
		if x.live == 0 && !x.releasing {
			take(x)
		}
	}
	return rs
}
