package resource

// CPU tests of SubAllocator, over a fake upstream that hands out addresses
// from a counter and a fake stream orderer that records what the real one
// would ask of the driver. Streams here are new(cuda.Stream) values: the
// sub-allocator only uses them as keys and hands them to the orderer.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

const (
	saKiB = 1 << 10
	saMiB = 1 << 20
)

// saCall is one upstream call the fake saw.
type saCall struct {
	ptr    cuda.DevicePtr
	size   uint64
	stream *cuda.Stream
}

// saUpstream is a fake upstream: addresses come from a counter, blocks
// are laid out back to back (so a sub-allocator that merged across blocks
// would be caught), and nothing touches a driver.
type saUpstream struct {
	mu      sync.Mutex
	next    uint64 // next address
	offset  uint64 // added to every address, to test misaligned upstreams
	limit   uint64 // refuse (out of memory) past this many live bytes; 0: no limit
	held    uint64
	live    map[cuda.DevicePtr]uint64
	allocs  []saCall
	frees   []saCall
	freeErr func(s *cuda.Stream) error // if set, decides each Deallocate's outcome
}

func newSAUpstream() *saUpstream {
	return &saUpstream{next: 1 << 32, live: map[cuda.DevicePtr]uint64{}}
}

func (f *saUpstream) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if size == 0 {
		return 0, s, nil
	}
	if f.limit != 0 && f.held+size > f.limit {
		return 0, nil, &cuda.OpError{Op: "fake.Allocate", Err: fmt.Errorf("%d bytes: %w", size, cuda.ErrorOutOfMemory)}
	}
	ptr := cuda.DevicePtr(f.next + f.offset)
	f.next += (size + f.offset + 4095) &^ 4095
	f.held += size
	f.live[ptr] = size
	f.allocs = append(f.allocs, saCall{ptr, size, s})
	return ptr, s, nil
}

func (f *saUpstream) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ferr error
	if f.freeErr != nil {
		// An error wrapping buffer.ErrPartlyFreed frees the memory
		// anyway, as the contract of that error says; any other refuses.
		if ferr = f.freeErr(s); ferr != nil && !errors.Is(ferr, buffer.ErrPartlyFreed) {
			return ferr
		}
	}
	if got, ok := f.live[ptr]; !ok || got != size {
		return cuda.Errorf("fake.Deallocate", cuda.ErrInvalidArgument, "%#x (%d bytes) is not live (have %d)", uint64(ptr), size, got)
	}
	delete(f.live, ptr)
	f.held -= size
	f.frees = append(f.frees, saCall{ptr, size, s})
	return ferr
}

func (f *saUpstream) DeviceAccessible() bool { return true }
func (f *saUpstream) HostAccessible() bool   { return false }
func (f *saUpstream) DeviceID() int          { return 3 }
func (f *saUpstream) String() string         { return "fake" }

func (f *saUpstream) counts() (allocs, frees, live int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.allocs), len(f.frees), len(f.live)
}

// saOrder is a fake orderer recording its calls.
type saOrder struct {
	mu      sync.Mutex
	waits   [][2]*cuda.Stream // {dst, src}
	syncs   []*cuda.Stream
	forgets []*cuda.Stream
	closes  int
	waitErr error
	syncErr error
	// syncFail, if set, decides each sync's outcome (after syncErr).
	syncFail func(s *cuda.Stream) error
	// forgetErrs and closeErrs are returned by the next forget and close
	// calls, one each, before they succeed again; a failed call is
	// recorded too.
	forgetErrs []error
	closeErrs  []error
	// noOrder lists source streams mayOrder refuses.
	noOrder map[*cuda.Stream]bool
}

func (o *saOrder) admit(op string, s *cuda.Stream, _ bool) error { return s.RefuseCapture(op) }

// mayOrder refuses the pairs listed in noOrder (src streams whose ranges
// must not be taken), as a capturing stream's would be.
func (o *saOrder) mayOrder(dst, src *cuda.Stream) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.noOrder[src]
}

func (o *saOrder) waitFor(dst, src *cuda.Stream) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.waitErr != nil {
		return o.waitErr
	}
	o.waits = append(o.waits, [2]*cuda.Stream{dst, src})
	return nil
}

func (o *saOrder) sync(s *cuda.Stream) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.syncErr != nil {
		return o.syncErr
	}
	if o.syncFail != nil {
		if err := o.syncFail(s); err != nil {
			return err
		}
	}
	o.syncs = append(o.syncs, s)
	return nil
}

func (o *saOrder) forget(s *cuda.Stream) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.forgets = append(o.forgets, s)
	if len(o.forgetErrs) > 0 {
		err := o.forgetErrs[0]
		o.forgetErrs = o.forgetErrs[1:]
		return err
	}
	return nil
}

func (o *saOrder) close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closes++
	if len(o.closeErrs) > 0 {
		err := o.closeErrs[0]
		o.closeErrs = o.closeErrs[1:]
		return err
	}
	return nil
}

func (o *saOrder) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.waits, o.syncs, o.forgets = nil, nil, nil
}

// newSA returns a sub-allocator over a fake upstream with a fake orderer,
// checked for consistency and buffer leaks when the test ends; the test
// closes it.
func newSA(t testing.TB, opts *SubAllocatorOptions) (*SubAllocator, *saUpstream, *saOrder) {
	t.Helper()
	up := newSAUpstream()
	a, err := NewSubAllocator(up, opts)
	require.NoError(t, err)
	o := &saOrder{}
	a.order = o
	leaks := buffer.Leaks()
	t.Cleanup(func() {
		saCheck(t, a)
		assert.Equal(t, leaks, buffer.Leaks(), "buffers collected without Close")
	})
	return a, up, o
}

// saCheck verifies the sub-allocator's structures: every block is covered
// by its chunks exactly, in address order; free chunks sit in their
// stream's size class, with no two free neighbours on one stream; live
// chunks are in the live map; the books add up.
func saCheck(t testing.TB, a *SubAllocator) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.up == nil {
		return
	}
	inList := map[int32]int32{} // free chunk → list id
	var free uint64
	for _, l := range a.streams {
		require.Same(t, l, a.lists[l.key])
		require.Same(t, l, a.listTab[l.id])
		n, bytes := 0, uint64(0)
		for r := range subRows {
			require.Equal(t, l.colMap[r] != 0, l.rowMap&(1<<r) != 0, "row bitmap of row %d", r)
			for k := range subCols {
				h := l.heads[r][k]
				require.Equal(t, h != 0, l.colMap[r]&(1<<k) != 0, "column bitmap of class %d/%d", r, k)
				prev := int32(0)
				for i := h; i != 0; i = a.chunks[i].fnext {
					c := &a.chunks[i]
					require.Equal(t, prev, c.fprev)
					cr, ck := subClass(c.size)
					require.Equal(t, [2]int{r, k}, [2]int{cr, ck}, "chunk of %d bytes in the wrong class", c.size)
					require.Equal(t, l.id, c.list)
					inList[i] = l.id
					n++
					bytes += c.size
					prev = i
				}
			}
		}
		require.Equal(t, l.n, n, "free ranges of a list")
		require.Equal(t, l.bytes, bytes, "free bytes of a list")
		free += bytes
	}
	require.Len(t, a.lists, len(a.streams))
	lists := 0
	for _, l := range a.listTab {
		if l != nil {
			lists++
		}
	}
	require.Equal(t, len(a.streams), lists, "list table")
	require.Equal(t, len(a.listTab)-1, lists+len(a.freeList), "list ids")

	var used, held uint64
	live, chunks := 0, 0
	for i, b := range a.blocks {
		if i > 0 {
			require.Less(t, a.blocks[i-1].base+a.blocks[i-1].size, b.base+1, "blocks sorted and disjoint")
		}
		require.Same(t, b, a.blockTab[b.id])
		held += b.size
		if b.releasing {
			continue
		}
		require.Zero(t, a.chunks[b.first].prev)
		require.GreaterOrEqual(t, a.chunks[b.first].addr, b.base)
		require.Zero(t, a.chunks[b.first].addr%a.align)
		end := a.chunks[b.first].addr
		bl := 0
		for i := b.first; i != 0; i = a.chunks[i].next {
			c := &a.chunks[i]
			chunks++
			require.Equal(t, b.id, c.blk)
			require.Equal(t, end, c.addr, "chunks cover the block without gaps")
			require.NotZero(t, c.size)
			require.Zero(t, c.size%a.align)
			end += c.size
			if c.next != 0 {
				require.Equal(t, i, a.chunks[c.next].prev)
			}
			if c.list == 0 {
				require.Equal(t, i, a.live.get(c.addr), "live chunk %#x in the live index", c.addr)
				used += c.size
				bl++
				continue
			}
			require.Equal(t, c.list, inList[i], "free chunk %#x in its list", c.addr)
			if c.next != 0 {
				require.NotEqual(t, c.list, a.chunks[c.next].list, "free neighbours on one stream at %#x are not merged", c.addr)
			}
		}
		require.LessOrEqual(t, end, b.base+b.size)
		require.Equal(t, b.live, bl, "live count of block %#x", b.base)
		live += bl
	}
	blocks := 0
	for _, b := range a.blockTab {
		if b != nil {
			blocks++
		}
	}
	require.Equal(t, len(a.blocks), blocks, "block table")
	require.Equal(t, len(a.blockTab)-1, blocks+len(a.freeBlk), "block ids")
	require.Equal(t, a.live.n, live, "every live allocation in a block")
	require.Equal(t, len(a.chunks)-1, chunks+len(a.spare), "every chunk in a block or spare")
	require.Equal(t, a.used, used)
	require.Equal(t, a.held, held)
	require.LessOrEqual(t, used+free, held)
	saCheckCaches(t, a)
}

// saCheckCaches verifies the per-stream caches against the shared books:
// every range a shard holds (handed out or free) is a live chunk marked
// with that cache and shard, and every chunk so marked is held by it.
func saCheckCaches(t testing.TB, a *SubAllocator) {
	t.Helper()
	require.Len(t, a.cacheTab, len(a.freeCache)+len(a.cacheMap)+1, "cache ids")
	held := 0
	for s, c := range a.cacheMap {
		require.Same(t, c, a.cacheTab[c.id])
		require.Same(t, s, c.key)
		shards := c.all()
		require.Same(t, &c.own, shards[0], "the cache's own shard is shard 0")
		require.Zero(t, len(shards)&(len(shards)-1), "a power of two of shards")
		require.LessOrEqual(t, len(shards), subMaxShards)
		var limits uint64
		for k, sh := range shards {
			sh.mu.Lock()
			limits += sh.limit
			var bytes uint64
			for _, e := range sh.free {
				ch := &a.chunks[e.c]
				require.Equal(t, [4]uint64{e.addr, e.size, uint64(c.id), uint64(k)}, [4]uint64{ch.addr, ch.size, uint64(ch.cache), uint64(ch.shard)}, "free cached range")
				require.Zero(t, ch.list, "a cached range is live to the books")
				require.Equal(t, e.c, a.live.get(e.addr))
				require.Zero(t, sh.live.get(e.addr), "free and handed out at once")
				bytes += e.size
			}
			require.Equal(t, sh.bytes, bytes)
			require.LessOrEqual(t, len(sh.free), subCacheRanges)
			require.LessOrEqual(t, sh.bytes, sh.limit)
			n := 0
			for _, sl := range sh.live.slots {
				if sl.addr == 0 {
					continue
				}
				n++
				ch := &a.chunks[sl.c]
				require.Equal(t, [4]uint64{sl.addr, sl.size, uint64(c.id), uint64(k)}, [4]uint64{ch.addr, ch.size, uint64(ch.cache), uint64(ch.shard)}, "handed-out cached range")
				require.Equal(t, sl.c, a.live.get(sl.addr))
			}
			require.Equal(t, sh.live.n, n)
			if sh.dead {
				require.Empty(t, sh.free, "a dead shard holds nothing free")
			}
			require.Equal(t, c.own.dead, sh.dead, "the shards of a cache die together")
			held += len(sh.free) + sh.live.n
			sh.mu.Unlock()
		}
		require.LessOrEqual(t, limits, a.cacheBytes, "the shards' limits split the cache's")
	}
	marked := 0
	for i := 1; i < len(a.chunks); i++ {
		if a.chunks[i].cache != 0 {
			marked++
		} else {
			require.Zero(t, a.chunks[i].shard, "a shard without a cache")
		}
	}
	require.Equal(t, held, marked, "chunks marked with a cache")
}

func TestSubAllocatorBasics(t *testing.T) {
	a, up, o := newSA(t, nil)
	defer func() { assert.NoError(t, a.Close()) }()
	assert.True(t, a.DeviceAccessible())
	assert.False(t, a.HostAccessible())
	assert.Equal(t, 3, a.DeviceID())
	assert.Same(t, up, a.Upstream())
	assert.Zero(t, a.Stats())

	b, err := a.Allocate(1000, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(1000), b.Size())
	assert.Zero(t, uint64(b.Ptr())%256)
	assert.Same(t, a, b.Resource())
	assert.Equal(t, SubAllocatorStats{Reserved: 64 * saMiB, Used: 1024, Free: 64*saMiB - 1024, Blocks: 1, Allocations: 1, FreeRanges: 1}, a.Stats())
	require.Len(t, up.allocs, 1)
	assert.Equal(t, saCall{up.allocs[0].ptr, 64 * saMiB, nil}, up.allocs[0], "one default-sized block, on the stream asked for")
	p := b.Ptr()
	require.NoError(t, b.Close())
	assert.Equal(t, SubAllocatorStats{Reserved: 64 * saMiB, Free: 64 * saMiB, Blocks: 1, FreeRanges: 1}, a.Stats(), "the range merged back")
	saCheck(t, a)

	for range 3 {
		b, err = a.Allocate(1000, nil)
		require.NoError(t, err)
		assert.Equal(t, p, b.Ptr(), "the same range again")
		require.NoError(t, b.Close())
	}
	allocs, frees, _ := up.counts()
	assert.Equal(t, [2]int{1, 0}, [2]int{allocs, frees}, "no upstream call after the first")
	assert.Empty(t, o.waits)
	assert.Contains(t, a.String(), "SubAllocator(fake, 1 blocks")
}

func TestSubAllocatorZeroSize(t *testing.T) {
	a, up, _ := newSA(t, nil)
	b, err := a.Allocate(0, nil)
	require.NoError(t, err)
	assert.Zero(t, b.Size())
	assert.Zero(t, b.Ptr())
	require.NoError(t, b.Close())
	allocs, _, _ := up.counts()
	assert.Zero(t, allocs, "size 0 asks the upstream for nothing")
	assert.Zero(t, a.Stats())
	require.NoError(t, a.Close())
}

func TestSubAllocatorOptions(t *testing.T) {
	up := newSAUpstream()
	for _, tc := range []struct {
		opts SubAllocatorOptions
		msg  string
	}{
		{SubAllocatorOptions{Alignment: 48}, "Alignment 48 is not a power of two"},
		{SubAllocatorOptions{InitialSize: 10, MaxSize: 5}, "InitialSize 10 exceeds MaxSize 5"},
		{SubAllocatorOptions{GrowSize: math.MaxUint64}, "GrowSize 18446744073709551615 overflows"},
		{SubAllocatorOptions{InitialSize: math.MaxUint64}, "InitialSize 18446744073709551615 overflows"},
	} {
		_, err := NewSubAllocator(up, &tc.opts)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "NewSubAllocator: ")
		assert.Contains(t, err.Error(), tc.msg)
	}
	for _, mr := range []buffer.MemoryResource{nil, (*DevicePool)(nil), (*SubAllocator)(nil)} {
		_, err := NewSubAllocator(mr, nil)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Equal(t, "NewSubAllocator: cuda: invalid argument: nil upstream resource", err.Error())
	}

	// InitialSize: one block up front, on the upstream's default stream;
	// the first allocation on a stream takes it after ordering.
	a, up, o := newSA(t, &SubAllocatorOptions{InitialSize: 1000, GrowSize: 4 * saKiB})
	require.Len(t, up.allocs, 1)
	assert.Equal(t, uint64(1024), up.allocs[0].size)
	assert.Nil(t, up.allocs[0].stream)
	s := new(cuda.Stream)
	b, err := a.Allocate(512, s)
	require.NoError(t, err)
	assert.Equal(t, [][2]*cuda.Stream{{s, nil}}, o.waits, "s waits for the default stream, then takes its ranges")
	assert.Len(t, up.allocs, 1)
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())

	// The upstream refuses the initial block.
	up = newSAUpstream()
	up.limit = saMiB
	_, err = NewSubAllocator(up, &SubAllocatorOptions{InitialSize: 2 * saMiB})
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "NewSubAllocator: 2097152 bytes on the default stream: grow from fake")
}

func TestSubAllocatorAlignment(t *testing.T) {
	for _, align := range []uint64{1, 8, 256, 4096, 64 * saKiB} {
		t.Run(fmt.Sprint(align), func(t *testing.T) {
			a, up, _ := newSA(t, &SubAllocatorOptions{Alignment: align, GrowSize: 256 * saKiB})
			up.offset = 256 // the upstream gives 256-byte alignment only
			var bufs []*buffer.Buffer
			for i, size := range []uint64{1, 3, 15, 16, 17, 100, 255, 256, 257, 1000, 4097, 70000} {
				b, err := a.Allocate(size, nil)
				require.NoError(t, err, "size %d", size)
				assert.Zero(t, uint64(b.Ptr())%align, "allocation %d (%d bytes) at %#x", i, size, uint64(b.Ptr()))
				bufs = append(bufs, b)
			}
			saCheck(t, a)
			var want uint64
			for _, b := range bufs {
				n, _ := alignUp(b.Size(), align)
				want += n
			}
			assert.Equal(t, want, a.Stats().Used)
			for _, b := range bufs {
				require.NoError(t, b.Close())
			}
			st := a.Stats()
			assert.Equal(t, st.Blocks, st.FreeRanges, "everything merged back")
			require.NoError(t, a.Close())
		})
	}
}

// An upstream that breaks its contract (an address that cannot be
// aligned) is reported, and its buffer given back.
func TestSubAllocatorBadUpstream(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: 4 * saKiB})
	up.offset = 8
	_, err := a.Allocate(4*saKiB, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "which cannot hold 4096 bytes aligned to 256")
	b, err := a.Allocate(100, nil) // a misaligned block still serves what fits
	require.NoError(t, err)
	assert.Zero(t, uint64(b.Ptr())%256)
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
	_, frees, live := up.counts()
	assert.Equal(t, [2]int{2, 0}, [2]int{frees, live})
}

// The production orderer reports what it cannot do instead of panicking:
// it refuses zero streams at the door (their ranges could never be ordered
// or waited for); nothing is allocated, and the allocator closes cleanly.
func TestSubAllocatorEventOrderNoDriver(t *testing.T) {
	if _, err := cuda.Devices(); err == nil {
		t.Skip("a driver is present: the GPU tests cover the event orderer")
	}
	up := newSAUpstream()
	a, err := NewSubAllocator(up, &SubAllocatorOptions{GrowSize: saMiB})
	require.NoError(t, err)
	_, err = a.Allocate(saMiB, new(cuda.Stream))
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "zero cuda.Stream")
	assert.Contains(t, a.Deallocate(0x1000, 64, new(cuda.Stream)).Error(), "zero cuda.Stream")
	saCheck(t, a)
	assert.Zero(t, a.Stats().Blocks)
	require.NoError(t, a.Close())
	allocs, _, live := up.counts()
	assert.Equal(t, [2]int{0, 0}, [2]int{allocs, live})
}

func TestSubAllocatorOverflow(t *testing.T) {
	a, up, _ := newSA(t, nil)
	defer func() { assert.NoError(t, a.Close()) }()
	for _, size := range []uint64{math.MaxUint64, math.MaxUint64 - 254} {
		_, err := a.Allocate(size, nil)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "size %d", size)
		assert.Contains(t, err.Error(), "SubAllocator.Allocate: ")
		assert.Contains(t, err.Error(), fmt.Sprintf("%d bytes overflow when aligned to 256 bytes", size))
	}
	// A huge request that aligns: the upstream says no.
	up.limit = 1 << 40
	_, err := a.Allocate(1<<62, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	allocs, _, _ := up.counts()
	assert.Zero(t, allocs)
}

func TestSubAllocatorGrowth(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, MaxSize: 3 * saMiB})
	var bufs []*buffer.Buffer
	for range 3 {
		b, err := a.Allocate(saMiB, nil)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	assert.Equal(t, 3, a.Stats().Blocks)
	_, err := a.Allocate(256, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Equal(t, "SubAllocator.Allocate: 256 bytes on the default stream: a new block of 256 bytes would exceed MaxSize 3145728 (3145728 reserved, 0 of it free in ranges too small or fragmented): CUDA_ERROR_OUT_OF_MEMORY", err.Error())

	// It keeps working: freed memory is reused without the upstream.
	require.NoError(t, bufs[1].Close())
	b, err := a.Allocate(256, nil)
	require.NoError(t, err)
	b2, err := a.Allocate(saMiB-256, nil)
	require.NoError(t, err)
	_, err = a.Allocate(256, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	allocs, _, _ := up.counts()
	assert.Equal(t, 3, allocs)
	saCheck(t, a)
	for _, b := range []*buffer.Buffer{bufs[0], bufs[2], b, b2} {
		require.NoError(t, b.Close())
	}
	require.NoError(t, a.Close())
	_, frees, live := up.counts()
	assert.Equal(t, [2]int{3, 0}, [2]int{frees, live}, "Close gives every block back")
}

func TestSubAllocatorGrowSizes(t *testing.T) {
	// A request above GrowSize gets a block of its own size.
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	b, err := a.Allocate(5*saMiB+1, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(5*saMiB+256), up.allocs[0].size)
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())

	// Growth shrinks to what MaxSize leaves.
	a, up, _ = newSA(t, &SubAllocatorOptions{GrowSize: saMiB, MaxSize: saMiB + saMiB/2})
	b1, err := a.Allocate(256, nil)
	require.NoError(t, err)
	_, err = a.Allocate(saMiB, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory, "1 MiB does not fit in the half MiB left")
	b2, err := a.Allocate(saMiB-256, nil)
	require.NoError(t, err, "fits in the first block")
	b3, err := a.Allocate(300*saKiB, nil)
	require.NoError(t, err)
	require.Len(t, up.allocs, 2)
	assert.Equal(t, uint64(saMiB/2), up.allocs[1].size, "the second block is what MaxSize leaves")
	for _, b := range []*buffer.Buffer{b1, b2, b3} {
		require.NoError(t, b.Close())
	}
	require.NoError(t, a.Close())

	// The upstream refuses GrowSize: ask for the request alone.
	a, up, _ = newSA(t, &SubAllocatorOptions{GrowSize: 4 * saMiB})
	up.limit = 3 * saMiB
	b, err = a.Allocate(saMiB, nil)
	require.NoError(t, err)
	require.Len(t, up.allocs, 1)
	assert.Equal(t, uint64(saMiB), up.allocs[0].size)
	_, err = a.Allocate(3*saMiB, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "SubAllocator.Allocate: 3145728 bytes on the default stream: grow from fake: fake.Allocate: 3145728 bytes: CUDA_ERROR_OUT_OF_MEMORY")
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
}

func TestSubAllocatorStreams(t *testing.T) {
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	s1, s2 := new(cuda.Stream), new(cuda.Stream)

	b, err := a.Allocate(256*saKiB, s1)
	require.NoError(t, err)
	require.Len(t, up.allocs, 1)
	assert.Same(t, s1, up.allocs[0].stream, "blocks are taken on the stream that needs them")
	require.NoError(t, b.Close()) // freed on s1
	b, err = a.Allocate(saMiB, s1)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	assert.Empty(t, o.waits, "one stream never waits")

	// s2 has nothing: it orders itself after s1 and takes s1's ranges.
	b, err = a.Allocate(256*saKiB, s2)
	require.NoError(t, err)
	assert.Equal(t, [][2]*cuda.Stream{{s2, s1}}, o.waits)
	assert.Zero(t, a.lists[s1].n, "s1's ranges moved to s2")
	b2, err := a.Allocate(256*saKiB, s2)
	require.NoError(t, err)
	assert.Len(t, o.waits, 1, "s2 uses its own ranges without waiting")

	// Freed on s1 by CloseOn: s1's again.
	require.NoError(t, b.CloseOn(s1))
	assert.Equal(t, uint64(256*saKiB), a.lists[s1].bytes)
	b, err = a.Allocate(256*saKiB, s1)
	require.NoError(t, err)
	assert.Len(t, o.waits, 1)

	// s1 needs more than it has: s2's remainder fits, so s1 waits for s2.
	b3, err := a.Allocate(512*saKiB, s1)
	require.NoError(t, err)
	assert.Equal(t, [][2]*cuda.Stream{{s2, s1}, {s1, s2}}, o.waits)
	allocs, _, _ := up.counts()
	assert.Equal(t, 1, allocs)

	// Nothing fits anywhere: grow, no waiting.
	require.NoError(t, b2.Close()) // 256 KiB free on s2
	b4, err := a.Allocate(512*saKiB, s1)
	require.NoError(t, err)
	assert.Len(t, o.waits, 2, "s2's free range is too small to be worth a wait")
	allocs, _, _ = up.counts()
	assert.Equal(t, 2, allocs)
	saCheck(t, a)

	// A failed ordering fails the allocation and changes nothing.
	require.NoError(t, b3.Close())     // 512 KiB on s1
	o.waitErr = errors.New("no event") // s2 would have to wait for s1
	_, err = a.Allocate(512*saKiB, s2)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SubAllocator.Allocate: 524288 bytes on ")
	assert.Contains(t, err.Error(), ": no event")
	o.waitErr = nil
	saCheck(t, a)
	for _, x := range []*buffer.Buffer{b, b4} {
		require.NoError(t, x.Close())
	}
}

// When growing is out of the question, ranges of every stream are
// gathered in case together they make room.
func TestSubAllocatorGatherOnOOM(t *testing.T) {
	a, _, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, MaxSize: saMiB})
	s1, s2 := new(cuda.Stream), new(cuda.Stream)
	var bufs []*buffer.Buffer
	for range 4 {
		b, err := a.Allocate(256*saKiB, s1)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	for i, b := range bufs {
		require.NoError(t, b.CloseOn([]*cuda.Stream{s1, s2}[i%2]))
	}
	assert.Equal(t, 4, a.Stats().FreeRanges, "alternate streams cannot merge")
	b, err := a.Allocate(saMiB, s1)
	require.NoError(t, err)
	assert.Equal(t, [][2]*cuda.Stream{{s1, s2}}, o.waits)
	require.NoError(t, b.Close())
	assert.Equal(t, 1, a.Stats().FreeRanges)
	require.NoError(t, a.Close())
}

func TestSubAllocatorTrim(t *testing.T) {
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s1, s2 := new(cuda.Stream), new(cuda.Stream)
	whole, err := a.Allocate(saMiB, s1) // block 1
	require.NoError(t, err)
	b1, err := a.Allocate(256*saKiB, s1) // block 2
	require.NoError(t, err)
	b2, err := a.Allocate(256*saKiB, s1)
	require.NoError(t, err)
	b3, err := a.Allocate(256*saKiB, s1)
	require.NoError(t, err)
	require.NoError(t, whole.Close())
	require.NoError(t, b1.CloseOn(s2))

	require.NoError(t, a.Trim())
	assert.Equal(t, []*cuda.Stream{s1}, o.syncs, "the stream that freed the block is waited for")
	require.Len(t, up.frees, 1)
	assert.Equal(t, saCall{up.allocs[0].ptr, saMiB, s1}, up.frees[0], "only the free block goes, freed on that stream")
	assert.Equal(t, SubAllocatorStats{Reserved: saMiB, Used: 512 * saKiB, Free: 512 * saKiB, Blocks: 1, Allocations: 2, FreeRanges: 2}, a.Stats())
	saCheck(t, a)

	// A block freed on two streams: both are waited for.
	o.reset()
	require.NoError(t, b2.CloseOn(s2))
	require.NoError(t, b3.Close())
	require.NoError(t, a.Trim())
	assert.ElementsMatch(t, []*cuda.Stream{s1, s2}, o.syncs)
	assert.ElementsMatch(t, []*cuda.Stream{s1, s2}, o.forgets, "streams with nothing left are forgotten")
	assert.Zero(t, a.Stats())
	assert.Empty(t, a.lists)
	_, frees, live := up.counts()
	assert.Equal(t, [2]int{2, 0}, [2]int{frees, live})

	// It still works, and a stream with nothing free is forgotten.
	b, err := a.Allocate(saMiB, s1)
	require.NoError(t, err)
	o.reset()
	require.NoError(t, a.Trim())
	assert.Equal(t, []*cuda.Stream{s1}, o.forgets)
	assert.Empty(t, o.syncs)
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
}

func TestSubAllocatorTrimFailures(t *testing.T) {
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s1, s2 := new(cuda.Stream), new(cuda.Stream)
	b, err := a.Allocate(saMiB, s1)
	require.NoError(t, err)
	require.NoError(t, b.CloseOn(s2))

	// Waiting fails: the block stays, usable.
	o.syncErr = errors.New("sync broke")
	err = a.Trim()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SubAllocator.Trim: give back ")
	assert.Contains(t, err.Error(), "sync broke")
	assert.Equal(t, SubAllocatorStats{Reserved: saMiB, Free: saMiB, Blocks: 1, FreeRanges: 1}, a.Stats())
	saCheck(t, a)
	b, err = a.Allocate(saMiB, s2)
	require.NoError(t, err)
	assert.Empty(t, o.waits, "still s2's")
	require.NoError(t, b.CloseOn(s2))
	o.syncErr = nil

	// The freeing stream is gone: the upstream's default stream frees.
	up.freeErr = func(s *cuda.Stream) error {
		if s != nil {
			return &cuda.OpError{Op: "fake.Deallocate", Err: cuda.ErrClosed}
		}
		return nil
	}
	require.NoError(t, a.Trim())
	require.Len(t, up.frees, 1)
	assert.Nil(t, up.frees[0].stream)

	// Both fail: the block stays; the next attempt succeeds.
	b, err = a.Allocate(saMiB, s1)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	up.freeErr = func(*cuda.Stream) error { return errors.New("upstream broke") }
	err = a.Trim()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "upstream broke")
	assert.Equal(t, 1, a.Stats().Blocks)
	saCheck(t, a)
	up.freeErr = nil
	require.NoError(t, a.Close())
	_, _, live := up.counts()
	assert.Zero(t, live)
}

func TestSubAllocatorClose(t *testing.T) {
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s := new(cuda.Stream)
	b1, err := a.Allocate(saMiB, s) // block 1
	require.NoError(t, err)
	b2, err := a.Allocate(100, s) // block 2
	require.NoError(t, err)
	b3, err := a.Allocate(100, s)
	require.NoError(t, err)
	free, err := a.Allocate(saMiB, s) // block 3, freed before Close
	require.NoError(t, err)
	require.NoError(t, free.Close())

	err = a.Close()
	require.ErrorIs(t, err, cuda.ErrorIllegalState)
	assert.Equal(t, "SubAllocator.Close: 3 allocations (1049088 bytes) are still live; their blocks are given back as they are deallocated: CUDA_ERROR_ILLEGAL_STATE", err.Error())
	assert.True(t, a.IsClosed())
	assert.Equal(t, 1, o.closes)
	_, frees, _ := up.counts()
	assert.Equal(t, 1, frees, "the free block went at once")

	_, err = a.Allocate(1, s)
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Equal(t, "SubAllocator.Allocate: cuda: use of closed handle", err.Error())
	_, err = a.Allocate(0, s)
	require.ErrorIs(t, err, cuda.ErrClosed)
	require.ErrorIs(t, a.Trim(), cuda.ErrClosed)

	require.NoError(t, b1.Close(), "Deallocate works after Close")
	_, frees, _ = up.counts()
	assert.Equal(t, 2, frees, "block 1 went with its last allocation")
	require.NoError(t, b2.Close())
	_, frees, _ = up.counts()
	assert.Equal(t, 2, frees, "block 2 still has b3")
	err = a.Close()
	require.ErrorIs(t, err, cuda.ErrorIllegalState)
	assert.Contains(t, err.Error(), "1 allocations (256 bytes) are still live")
	require.NoError(t, b3.Close())
	_, frees, live := up.counts()
	assert.Equal(t, [2]int{3, 0}, [2]int{frees, live})
	require.NoError(t, a.Close())
	require.NoError(t, a.Close())
	assert.Equal(t, 1, o.closes)
	assert.Zero(t, a.Stats())
}

func TestSubAllocatorBadFrees(t *testing.T) {
	a, _, _ := newSA(t, nil)
	defer func() { assert.NoError(t, a.Close()) }()
	b, err := a.Allocate(1000, nil)
	require.NoError(t, err)
	p := b.Ptr()

	err = a.Deallocate(0x1000, 64, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, "SubAllocator.Deallocate: cuda: invalid argument: 0x1000 (64 bytes) was not allocated by this SubAllocator", err.Error())

	err = a.Deallocate(p+256, 64, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "is not a live allocation")

	err = a.Deallocate(p, 2000, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), fmt.Sprintf("%#x: 2000 bytes given, the allocation has 1024 (aligned to 256)", uint64(p)))
	err = a.Deallocate(p, math.MaxUint64, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, 1, a.Stats().Allocations, "a refused free changes nothing")

	require.NoError(t, a.Deallocate(p, 1000, nil))
	err = a.Deallocate(p, 1000, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument, "double free")
	assert.Equal(t, fmt.Sprintf("SubAllocator.Deallocate: cuda: invalid argument: %#x (1000 bytes) is not a live allocation: already freed (double free?), or not the start of one", uint64(p)), err.Error())
	require.NoError(t, a.Deallocate(0, 0, nil), "address 0 is a no-op")
	_, _, err = b.Disown() // the buffer is still open: its memory was freed behind its back
	require.NoError(t, err)
}

func TestSubAllocatorNilAndZero(t *testing.T) {
	for name, a := range map[string]*SubAllocator{"nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			for _, size := range []uint64{0, 1024, math.MaxUint64} {
				b, err := a.Allocate(size, nil)
				assert.Nil(t, b)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Equal(t, "SubAllocator.Allocate: cuda: invalid argument: SubAllocator is not initialized (create it with NewSubAllocator)", err.Error())
			}
			assert.NoError(t, a.Deallocate(0, 0, nil))
			assert.ErrorIs(t, a.Deallocate(0x1000, 64, nil), cuda.ErrInvalidArgument)
			assert.ErrorIs(t, a.Trim(), cuda.ErrInvalidArgument)
			assert.NoError(t, a.Close())
			assert.True(t, a.IsClosed())
			assert.Zero(t, a.Stats())
			assert.False(t, a.DeviceAccessible())
			assert.False(t, a.HostAccessible())
			assert.Equal(t, -1, a.DeviceID())
			assert.Nil(t, a.Upstream())
			assert.Equal(t, "SubAllocator(nil)", a.String())
		})
	}
}

func TestSubAllocatorClasses(t *testing.T) {
	prev := [2]int{0, 0}
	for _, size := range []uint64{1, 2, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000, 1 << 20, 1<<20 + 1, 1 << 40, math.MaxUint64} {
		r, k := subClass(size)
		require.Less(t, r, subRows)
		require.Less(t, k, subCols)
		cur := [2]int{r, k}
		require.True(t, cur[0] > prev[0] || cur[0] == prev[0] && cur[1] >= prev[1], "classes grow with sizes (%d)", size)
		prev = cur
	}
	// Every size of a class above n's own is at least n.
	for range 10000 {
		n := rand.Uint64N(1<<30) + 1
		m := n + rand.Uint64N(1<<30) + 1
		rn, kn := subClass(n)
		rm, km := subClass(m)
		if rm > rn || rm == rn && km > kn {
			continue
		}
		require.Equal(t, [2]int{rn, kn}, [2]int{rm, km}, "a larger size %d in a lower class than %d", m, n)
	}
}

// saModel is a randomized workload checked against a simple model: live
// ranges never overlap, lie inside upstream blocks, and hold the
// addresses the buffers report.
func saModel(t *testing.T, a *SubAllocator, up *saUpstream, streams []*cuda.Stream, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 0))
	var live []*buffer.Buffer
	check := func() {
		type rg struct{ lo, hi uint64 }
		var rs []rg
		for _, b := range live {
			n, _ := alignUp(b.Size(), a.align)
			rs = append(rs, rg{uint64(b.Ptr()), uint64(b.Ptr()) + n})
		}
		slices.SortFunc(rs, func(x, y rg) int { return int(x.lo>>8) - int(y.lo>>8) })
		for i := 1; i < len(rs); i++ {
			require.LessOrEqual(t, rs[i-1].hi, rs[i].lo, "live ranges overlap")
		}
		up.mu.Lock()
		for _, r := range rs {
			in := false
			for p, n := range up.live {
				if r.lo >= uint64(p) && r.hi <= uint64(p)+n {
					in = true
					break
				}
			}
			require.True(t, in, "range %#x-%#x outside every upstream block", r.lo, r.hi)
		}
		up.mu.Unlock()
		saCheck(t, a)
	}
	for i := range ops {
		if len(live) == 0 || rng.IntN(100) < 55 {
			var size uint64
			switch rng.IntN(4) {
			case 0:
				size = rng.Uint64N(512) + 1
			case 1:
				size = rng.Uint64N(64*saKiB) + 1
			case 2:
				size = rng.Uint64N(512*saKiB) + 1
			default:
				size = uint64(rng.IntN(8)+1) * 256
			}
			b, err := a.Allocate(size, streams[rng.IntN(len(streams))])
			require.NoError(t, err)
			live = append(live, b)
		} else {
			j := rng.IntN(len(live))
			require.NoError(t, live[j].CloseOn(streams[rng.IntN(len(streams))]))
			live = slices.Delete(live, j, j+1)
		}
		if i%50 == 0 {
			check()
		}
	}
	check()
	for _, b := range live {
		require.NoError(t, b.CloseOn(streams[rng.IntN(len(streams))]))
	}
}

func TestSubAllocatorRandomOneStream(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
			s := new(cuda.Stream)
			saModel(t, a, up, []*cuda.Stream{s}, seed, 3000)
			saCheck(t, a)
			st := a.Stats()
			assert.Equal(t, st.Blocks, st.FreeRanges, "one free range per block once all is freed")
			assert.Equal(t, st.Reserved, st.Free)
			assert.Empty(t, o.waits)
			require.NoError(t, a.Close())
			_, _, n := up.counts()
			assert.Zero(t, n)
		})
	}
}

func TestSubAllocatorRandomStreams(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, Alignment: 512})
			streams := []*cuda.Stream{nil, new(cuda.Stream), new(cuda.Stream), new(cuda.Stream)}
			saModel(t, a, up, streams, seed, 3000)
			saCheck(t, a)
			assert.NotEmpty(t, o.waits)
			for _, w := range o.waits {
				assert.NotSame(t, w[0], w[1])
			}
			require.NoError(t, a.Trim())
			assert.Zero(t, a.Stats())
			_, _, n := up.counts()
			assert.Zero(t, n)
			require.NoError(t, a.Close())
		})
	}
}

func TestSubAllocatorConcurrent(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: 4 * saMiB})
	shared := []*cuda.Stream{nil, new(cuda.Stream)}
	var mu sync.Mutex
	owner := map[cuda.DevicePtr]int{} // each live address, by goroutine
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			own := new(cuda.Stream)
			streams := append([]*cuda.Stream{own}, shared...)
			var live []*buffer.Buffer
			for i := range 2000 {
				if len(live) < 8 && (len(live) == 0 || rng.IntN(2) == 0) {
					b, err := a.Allocate(rng.Uint64N(8*saKiB)+1, streams[rng.IntN(len(streams))])
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					if o, dup := owner[b.Ptr()]; dup {
						t.Errorf("goroutine %d got %#x, live in goroutine %d", g, uint64(b.Ptr()), o)
					}
					owner[b.Ptr()] = g
					mu.Unlock()
					live = append(live, b)
				} else {
					j := rng.IntN(len(live))
					mu.Lock()
					delete(owner, live[j].Ptr())
					mu.Unlock()
					assert.NoError(t, live[j].CloseOn(streams[rng.IntN(len(streams))]))
					live = slices.Delete(live, j, j+1)
				}
				if i%500 == 0 {
					_ = a.Stats()
					if g == 0 {
						assert.NoError(t, a.Trim())
					}
				}
			}
			for _, b := range live {
				mu.Lock()
				delete(owner, b.Ptr())
				mu.Unlock()
				assert.NoError(t, b.Close())
			}
		}()
	}
	wg.Wait()
	saCheck(t, a)
	assert.Zero(t, a.Stats().Allocations)
	require.NoError(t, a.Close())
	_, _, n := up.counts()
	assert.Zero(t, n)
}

// BenchmarkSubAllocatorPairFake: one Allocate + Buffer.Close on one
// stream over the fake upstream, no driver: what the sub-allocator adds
// to a Buffer's own cost (BenchmarkOwnedBufferPair). "core" skips the
// Buffer, "parallel" runs on every P with a stream each.
func BenchmarkSubAllocatorPairFake(b *testing.B) {
	for _, sz := range []struct {
		name string
		n    uint64
	}{{"256B", 256}, {"1MiB", saMiB}} {
		b.Run(sz.name, func(b *testing.B) {
			a, _, _ := newSA(b, nil)
			defer a.Close()
			s := new(cuda.Stream)
			b.ReportAllocs()
			for b.Loop() {
				buf, err := a.Allocate(sz.n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := buf.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("core/"+sz.name, func(b *testing.B) {
			a, _, _ := newSA(b, nil)
			defer a.Close()
			s := new(cuda.Stream)
			b.ReportAllocs()
			for b.Loop() {
				p, err := a.take(sz.n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Deallocate(p, sz.n, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("parallel/256B", func(b *testing.B) {
		a, _, _ := newSA(b, nil)
		defer a.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			s := new(cuda.Stream)
			for pb.Next() {
				buf, err := a.Allocate(256, s)
				if err != nil {
					b.Error(err)
					return
				}
				if err := buf.Close(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	// Many live allocations of mixed sizes: the free lists are fragmented.
	b.Run("fragmented/4KiB", func(b *testing.B) {
		a, _, _ := newSA(b, nil)
		defer a.Close()
		s := new(cuda.Stream)
		rng := rand.New(rand.NewPCG(1, 2))
		var keep []*buffer.Buffer
		for i := range 4000 {
			buf, err := a.Allocate(rng.Uint64N(16*saKiB)+1, s)
			if err != nil {
				b.Fatal(err)
			}
			if i%2 == 0 {
				keep = append(keep, buf)
			} else {
				_ = buf.Close()
			}
		}
		defer func() {
			for _, buf := range keep {
				_ = buf.Close()
			}
		}()
		b.ReportAllocs()
		for b.Loop() {
			buf, err := a.Allocate(4*saKiB, s)
			if err != nil {
				b.Fatal(err)
			}
			if err := buf.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// fakePairs runs 256-byte pairs from g goroutines over the fake upstream,
// all on one stream (shared) or each on its own: with a Buffer per pair
// (Allocate + Close), or with core, without (take + Deallocate).
func fakePairs(b *testing.B, g int, shared, core bool) {
	a, _, _ := newSA(b, nil)
	defer a.Close()
	one := new(cuda.Stream)
	stream := func(int) *cuda.Stream {
		if shared {
			return one
		}
		return new(cuda.Stream)
	}
	pair := func(s *cuda.Stream) error {
		buf, err := a.Allocate(256, s)
		if err != nil {
			return err
		}
		return buf.Close()
	}
	if core {
		pair = func(s *cuda.Stream) error {
			p, err := a.take(256, s)
			if err != nil {
				return err
			}
			return a.Deallocate(p, 256, s)
		}
	}
	parallelPairs(b, g, stream, pair)
}

// BenchmarkSubAllocatorParallelFake: 256-byte pairs from g goroutines,
// each on its own stream ("own") or all on one ("shared"), over the fake
// upstream and orderer: the sub-allocator's own scaling, no driver. With
// a Buffer per pair (as Allocate + Close), and "core" without (take +
// Deallocate). Compare pairs/s across g; on a machine with fewer cores
// than goroutines the rate can only stay flat. BenchmarkSubAllocatorParallel
// (GPU) is the same over a DevicePool.
func BenchmarkSubAllocatorParallelFake(b *testing.B) {
	for _, core := range []bool{false, true} {
		for _, g := range parallelGoroutines {
			for _, mode := range []string{"own", "shared"} {
				name := fmt.Sprintf("%d/%s", g, mode)
				if core {
					name = "core/" + name
				}
				b.Run(name, func(b *testing.B) { fakePairs(b, g, mode == "shared", core) })
			}
		}
	}
}

// Close waits for a Trim that is giving a block back on another goroutine.
// It used to skip the block (detached from the lists) and return nil while
// the Trim still held it; when the Trim's wait then failed, the block went
// back on the lists of a closed SubAllocator, held from the upstream with
// nothing left to free it. Now Close waits, collects the restored block
// and gives it back itself.
func TestSubAllocatorCloseWaitsForTrim(t *testing.T) {
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	p, _, err := a.AllocatePtr(4096, nil)
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, 4096, nil))

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	o.syncFail = func(*cuda.Stream) error {
		failed := false
		once.Do(func() {
			close(entered)
			o.mu.Unlock() // let Close's own calls to the orderer through
			<-release
			o.mu.Lock()
			failed = true
		})
		if failed {
			return errors.New("injected: the wait failed")
		}
		return nil
	}
	trimErr := make(chan error, 1)
	go func() { trimErr <- a.Trim() }()
	<-entered
	closeErr := make(chan error, 1)
	go func() { closeErr <- a.Close() }()
	select {
	case err := <-closeErr:
		t.Fatalf("Close returned (%v) while the Trim still held the block", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	require.Error(t, <-trimErr, "the Trim's wait failed: its block stayed")
	require.NoError(t, <-closeErr, "Close gave the restored block back")
	assert.Zero(t, a.Stats().Reserved)
	_, _, live := up.counts()
	assert.Zero(t, live, "nothing held from the upstream")
}
