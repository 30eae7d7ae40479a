package resource

// SubAllocator: chunks, blocks and size classes (a two-level segregated
// fit), and the carving and coalescing of chunks on a stream's free list.

import (
	"math/bits"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// subChunk is a range of an upstream block: live, or free on one stream's
// list. The chunks of a block form an address-ordered doubly linked list
// (prev, next), which makes coalescing O(1).
type subChunk struct {
	addr, size   uint64
	prev, next   int32 // address neighbours in the same block
	fprev, fnext int32 // links in the size class of the list holding the chunk
	blk          int32 // the block's id
	list         int32 // the id of the stream list holding the chunk while free; 0 while live
	cache        int32 // while live: the id of the cache holding it (handed out or free there), or 0
	row, col     uint8 // the size class while free
	shard        uint8 // with cache: the index of the cache's shard holding it
}

// subBlock is one allocation from the upstream.
type subBlock struct {
	buf       *buffer.Buffer // the upstream's buffer: freed by Trim or Close, by the safety net if the sub-allocator leaks
	base      uint64         // the buffer's address
	size      uint64         // the buffer's size (what Reserved counts)
	id        int32
	first     int32 // the chunk at the lowest address
	live      int   // live allocations in the block
	releasing bool  // detached from the lists while Trim or Close gives it back
	acquired  bool  // SegmentHooks.Acquired accepted it, and Released has not run
}

// Size classes (a two-level segregated fit): row 0 holds sizes below 16
// one per column; row r ≥ 1 holds [2^(r+3), 2^(r+4)) in 16 columns of
// equal width. Bitmaps find the next non-empty class in two instructions.
const (
	subCols = 16
	subRows = 61 // sizes up to 2^64-1: bits.Len64 64 → row 60
)

// subList is one stream's free ranges, by size class.
type subList struct {
	key    *cuda.Stream
	id     int32
	n      int    // free ranges in the list
	bytes  uint64 // free bytes in the list
	rowMap uint64
	colMap [subRows]uint16
	heads  [subRows][subCols]int32
}

// subClass returns the size class of size.
func subClass(size uint64) (row, col int) {
	if size < subCols {
		return 0, int(size)
	}
	fl := bits.Len64(size) - 1 // ≥ 4
	return fl - 3, int(size>>(fl-4)) & (subCols - 1)
}

// link puts chunk i (its size set) into its size class of l.
func (a *SubAllocator) link(l *subList, i int32) {
	c := &a.chunks[i]
	r, k := subClass(c.size)
	c.row, c.col = uint8(r), uint8(k)
	h := l.heads[r][k]
	c.fprev, c.fnext = 0, h
	if h != 0 {
		a.chunks[h].fprev = i
	}
	l.heads[r][k] = i
	l.colMap[r] |= 1 << k
	l.rowMap |= 1 << r
}

// unlink takes chunk i out of its size class of l.
func (a *SubAllocator) unlink(l *subList, i int32) {
	c := &a.chunks[i]
	r, k := int(c.row), int(c.col)
	if c.fprev != 0 {
		a.chunks[c.fprev].fnext = c.fnext
	} else {
		l.heads[r][k] = c.fnext
		if c.fnext == 0 {
			l.colMap[r] &^= 1 << k
			if l.colMap[r] == 0 {
				l.rowMap &^= 1 << r
			}
		}
	}
	if c.fnext != 0 {
		a.chunks[c.fnext].fprev = c.fprev
	}
	c.fprev, c.fnext = 0, 0
}

// resize changes the size of chunk i, free on l, moving it to its new
// class if that changed (for large ranges, carving a small piece rarely
// does).
func (a *SubAllocator) resize(l *subList, i int32, size uint64) {
	c := &a.chunks[i]
	r, k := subClass(size)
	if r == int(c.row) && k == int(c.col) {
		c.size = size
		return
	}
	a.unlink(l, i)
	c.size = size
	a.link(l, i)
}

// find returns a free chunk of l of at least n bytes, or 0: the first fit
// in n's own class, else the head of the next non-empty class (all of
// whose ranges fit).
func (a *SubAllocator) find(l *subList, n uint64) int32 {
	if l.rowMap == 0 {
		return 0
	}
	r, k := subClass(n)
	for i := l.heads[r][k]; i != 0; i = a.chunks[i].fnext {
		if a.chunks[i].size >= n {
			return i
		}
	}
	if m := l.colMap[r] & (^uint16(0) << (k + 1)); m != 0 {
		return l.heads[r][bits.TrailingZeros16(m)]
	}
	rm := l.rowMap & (^uint64(0) << (r + 1))
	if rm == 0 {
		return 0
	}
	r = bits.TrailingZeros64(rm)
	return l.heads[r][bits.TrailingZeros16(l.colMap[r])]
}

// any returns some free chunk of l, or 0.
func (l *subList) any() int32 {
	if l.rowMap == 0 {
		return 0
	}
	r := bits.TrailingZeros64(l.rowMap)
	return l.heads[r][bits.TrailingZeros16(l.colMap[r])]
}

// carveLocked takes n bytes from chunk i, free on l, and returns the
// live chunk: i itself when it fits exactly, else a new chunk cut from its
// end, so that i keeps its place (and usually its size class).
func (a *SubAllocator) carveLocked(l *subList, i int32, n uint64) int32 {
	l.bytes -= n
	if a.chunks[i].size == n {
		a.unlink(l, i)
		l.n--
		a.chunks[i].list = 0
		return i
	}
	u := a.newChunk() // may move a.chunks: take pointers after
	c, uc := &a.chunks[i], &a.chunks[u]
	uc.addr, uc.size, uc.blk = c.addr+c.size-n, n, c.blk
	uc.prev, uc.next = i, c.next
	if c.next != 0 {
		a.chunks[c.next].prev = u
	}
	c.next = u
	a.resize(l, i, c.size-n)
	return u
}

// freeLocked puts chunk i (live, or taken from another list) on l,
// merging it with its address neighbours that are free on l.
func (a *SubAllocator) freeLocked(l *subList, i int32) {
	c := &a.chunks[i]
	l.bytes += c.size
	p, nx := c.prev, c.next
	switch {
	case p != 0 && a.chunks[p].list == l.id:
		pc := &a.chunks[p]
		size := pc.size + c.size
		pc.next = nx
		if nx != 0 {
			a.chunks[nx].prev = p
		}
		a.recycle(i)
		if nx != 0 && a.chunks[nx].list == l.id {
			nc := &a.chunks[nx]
			a.unlink(l, nx)
			l.n--
			size += nc.size
			pc.next = nc.next
			if nc.next != 0 {
				a.chunks[nc.next].prev = p
			}
			a.recycle(nx)
		}
		a.resize(l, p, size)
	case nx != 0 && a.chunks[nx].list == l.id:
		nc := &a.chunks[nx]
		nc.prev = p
		if p != 0 {
			a.chunks[p].next = nx
		} else {
			a.blockTab[nc.blk].first = nx
		}
		nc.addr = c.addr
		size := nc.size + c.size
		a.recycle(i)
		a.resize(l, nx, size)
	default:
		c.list = l.id
		a.link(l, i)
		l.n++
	}
}

// newChunk returns the index of an unused chunk; it may grow a.chunks,
// so pointers into it taken before are stale.
func (a *SubAllocator) newChunk() int32 {
	if n := len(a.spare); n > 0 {
		i := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return i
	}
	a.chunks = append(a.chunks, subChunk{})
	return int32(len(a.chunks) - 1)
}

func (a *SubAllocator) recycle(i int32) {
	a.chunks[i] = subChunk{}
	a.spare = append(a.spare, i)
}
