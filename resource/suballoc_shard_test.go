package resource

// CPU tests of the shards of the SubAllocator's per-stream caches (one
// stream, many goroutines), over the fake upstream and orderer of
// suballoc_test.go.

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// useHint makes hint return what h returns until the test ends.
func useHint(t *testing.T, h func() uint32) {
	t.Helper()
	subHintHook = h
	t.Cleanup(func() { subHintHook = nil })
}

// widenStream gives s's cache n shards, making the cache first (an
// allocation on s, freed) if needed.
func widenStream(t *testing.T, a *SubAllocator, s *cuda.Stream, n int) *subCache {
	t.Helper()
	if a.cacheOf(s) == nil {
		p, err := a.take(256, s)
		require.NoError(t, err)
		require.NoError(t, a.Deallocate(p, 256, s))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.cacheMap[s]
	require.NotNil(t, c)
	a.widenLocked(c, n)
	require.Len(t, c.all(), n)
	return c
}

// shardFree returns the free ranges of each shard of s's cache.
func shardFree(a *SubAllocator, s *cuda.Stream) [][]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.cacheMap[s]
	if c == nil {
		return nil
	}
	var out [][]uint64
	for _, sh := range c.all() {
		sh.mu.Lock()
		var f []uint64
		for _, e := range sh.free {
			f = append(f, e.addr)
		}
		sh.mu.Unlock()
		out = append(out, f)
	}
	return out
}

// The shards of a stream's cache are that stream's: a range freed into
// any of them is reused on the stream at once, by the goroutine (P) whose
// shard holds it, and another stream gets it only once ordered after the
// first. A free from another shard than the allocation's is checked and
// goes to the stream's list.
func TestSubAllocatorShardsStreamOrdered(t *testing.T) {
	a, _, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	s, other := new(cuda.Stream), new(cuda.Stream)
	var cur uint32
	useHint(t, func() uint32 { return cur })
	widenStream(t, a, s, 4)
	a.Stats() // the range widenStream freed, back in the books
	require.Empty(t, slices.Concat(shardFree(a, s)...))

	// One allocation per shard, each freed on s from its own shard.
	ps := make([]cuda.DevicePtr, 4)
	for k := range ps {
		cur = uint32(k)
		p, err := a.take(4*saKiB, s)
		require.NoError(t, err)
		ps[k] = p
	}
	for k, p := range ps {
		cur = uint32(k) + 4 // hints wrap around the shards
		require.NoError(t, a.Deallocate(p, 4*saKiB, s))
	}
	for k, f := range shardFree(a, s) {
		assert.Equal(t, []uint64{uint64(ps[k])}, f, "shard %d", k)
	}
	saCheck(t, a)

	// Another stream never gets a cached range, and is ordered after s
	// before it takes what s's list holds.
	q, err := a.take(4*saKiB, other)
	require.NoError(t, err)
	assert.NotContains(t, ps, q)
	assert.Equal(t, [][2]*cuda.Stream{{other, s}}, o.waits)

	// s gets each range back on its shard, without waiting.
	for k := range ps {
		cur = uint32(k)
		p, err := a.take(4*saKiB, s)
		require.NoError(t, err)
		assert.Equal(t, ps[k], p, "shard %d", k)
	}
	assert.Len(t, o.waits, 1)

	// Freed from another shard (a goroutine that moved): wrong sizes and
	// double frees are refused there too; the range goes to s's list.
	cur = 1
	err = a.Deallocate(ps[0], 8*saKiB, s)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.NoError(t, a.Deallocate(ps[0], 4*saKiB, s))
	assert.Equal(t, [][]uint64{nil, nil, nil, nil}, shardFree(a, s), "not cached by shard 1")
	a.mu.Lock()
	assert.Equal(t, uint64(4*saKiB), a.lists[s].bytes, "on s's list")
	a.mu.Unlock()
	err = a.Deallocate(ps[0], 4*saKiB, s)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "already freed")

	// Freed into its shard, then freed again from each shard and stream.
	cur = 2
	require.NoError(t, a.Deallocate(ps[2], 4*saKiB, s))
	for k := range 4 {
		cur = uint32(k)
		for _, on := range []*cuda.Stream{s, other, nil} {
			err = a.Deallocate(ps[2], 4*saKiB, on)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument, "shard %d, stream %v", k, on)
			assert.Contains(t, err.Error(), "already freed")
		}
	}
	assert.Equal(t, []uint64{uint64(ps[2])}, shardFree(a, s)[2])

	// Allocated on s, freed on other: other's list gets it, no shard.
	cur = 3
	require.NoError(t, a.Deallocate(ps[3], 4*saKiB, other))
	assert.Empty(t, shardFree(a, s)[3])
	assert.Empty(t, slices.Concat(shardFree(a, other)...))
	cur = 1
	require.NoError(t, a.Deallocate(ps[1], 4*saKiB, s))
	require.NoError(t, a.Deallocate(q, 4*saKiB, other))
	saCheck(t, a)
	st := a.Stats()
	assert.Zero(t, st.Used)
	assert.Zero(t, st.Allocations)
	assert.Empty(t, slices.Concat(shardFree(a, s)...), "Stats flushed every shard")
}

// Each shard keeps its share of the cache: together they hold no more
// than a cache of one shard would, and what does not fit goes to the
// books.
func TestSubAllocatorShardsBounded(t *testing.T) {
	a, _, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	s := new(cuda.Stream)
	var cur uint32
	useHint(t, func() uint32 { return cur })
	widenStream(t, a, s, 4)
	var ps []cuda.DevicePtr
	for i := range 32 {
		cur = uint32(i % 4)
		p, err := a.take(16*saKiB, s)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i, p := range ps {
		cur = uint32(i % 4)
		require.NoError(t, a.Deallocate(p, 16*saKiB, s))
	}
	for k, f := range shardFree(a, s) {
		// A quarter of GrowSize over 4 shards: 64 KiB, 4 ranges each.
		assert.Len(t, f, 4, "shard %d", k)
	}
	saCheck(t, a)
	assert.Equal(t, SubAllocatorStats{Reserved: saMiB, Free: saMiB, Blocks: 1, FreeRanges: 1}, a.Stats())
}

// Trim and Close see the ranges in every shard; Close with allocations
// handed out by shards leaves them freeable, and the last free gives the
// block back, its SegmentHooks.Released called once.
func TestSubAllocatorShardsTrimClose(t *testing.T) {
	rec := newSegRecorder()
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, Segments: rec.hooks()})
	rec.up = up
	s := new(cuda.Stream)
	var cur uint32
	useHint(t, func() uint32 { return cur })
	widenStream(t, a, s, 8)
	a.Stats() // the range widenStream freed, back in the books

	// Every shard holds free ranges; nothing is live: Trim gives the
	// block back and forgets the cache.
	var ps []cuda.DevicePtr
	for k := range 8 {
		cur = uint32(k)
		p, err := a.take(saKiB, s)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for k, p := range ps {
		cur = uint32(k)
		require.NoError(t, a.Deallocate(p, saKiB, s))
	}
	for _, f := range shardFree(a, s) {
		require.Len(t, f, 1)
	}
	require.NoError(t, a.Trim())
	assert.Zero(t, a.Stats())
	assert.Nil(t, a.cacheOf(s), "forgotten")
	_, _, live := up.counts()
	assert.Zero(t, live)

	// Widened again, with ranges handed out and free in several shards.
	c := widenStream(t, a, s, 8)
	ps = ps[:0]
	for k := range 8 {
		cur = uint32(k)
		for range 2 {
			p, err := a.take(saKiB, s)
			require.NoError(t, err)
			ps = append(ps, p)
		}
	}
	for i, p := range ps {
		if i%2 == 0 {
			cur = uint32(i / 2)
			require.NoError(t, a.Deallocate(p, saKiB, s))
		}
	}
	require.NoError(t, a.Trim(), "nothing to give back: the block is in use")
	assert.Same(t, c, a.cacheOf(s), "a cache with allocations out stays")
	assert.Equal(t, 8, a.Stats().Allocations)

	require.ErrorIs(t, a.Close(), cuda.ErrorIllegalState)
	for _, sh := range c.all() {
		sh.mu.Lock()
		assert.True(t, sh.dead)
		assert.Empty(t, sh.free)
		sh.mu.Unlock()
	}
	_, err := a.take(saKiB, s)
	require.ErrorIs(t, err, cuda.ErrClosed)
	for i, p := range ps {
		if i%2 == 1 {
			cur = uint32(rand.IntN(8)) // from any shard
			require.NoError(t, a.Deallocate(p, saKiB, s))
			require.ErrorIs(t, a.Deallocate(p, saKiB, s), cuda.ErrInvalidArgument, "freed already")
		}
	}
	assert.Zero(t, a.Stats())
	_, _, live = up.counts()
	assert.Zero(t, live)
	rec.check(t)
}

// Running out of memory gives back the blocks whose free ranges sit in
// shards, and retries.
func TestSubAllocatorShardsOOM(t *testing.T) {
	a, _, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, MaxSize: 2 * saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	s, other := new(cuda.Stream), new(cuda.Stream)
	var cur uint32
	useHint(t, func() uint32 { return cur })
	widenStream(t, a, s, 4)
	var ps []cuda.DevicePtr
	for k := range 4 {
		cur = uint32(k)
		p, err := a.take(64*saKiB, s)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for k, p := range ps {
		cur = uint32(k)
		require.NoError(t, a.Deallocate(p, 64*saKiB, s))
	}
	// other may not take s's ranges (as if s were capturing): only giving
	// the free block back makes room.
	o.noOrder = map[*cuda.Stream]bool{s: true}
	p, _, err := a.AllocatePtr(2*saMiB, other)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), a.Stats().OutOfMemoryTrims)
	require.NoError(t, a.Deallocate(p, 2*saMiB, other))
}

// A cache widens when goroutines find its one shard held, often enough;
// not with one P.
func TestSubAllocatorShardsWiden(t *testing.T) {
	a, _, _ := newSA(t, nil)
	defer func() { assert.NoError(t, a.Close()) }()
	s := new(cuda.Stream)
	p, err := a.take(256, s)
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, 256, s))
	c := a.cacheOf(s)
	require.NotNil(t, c)

	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	a.widen(c)
	assert.Nil(t, c.wide.Load(), "one P: no shards")

	runtime.GOMAXPROCS(6)
	for try := 0; c.wide.Load() == nil; try++ {
		require.Less(t, try, 100, "never widened")
		c.own.mu.Lock()
		c.own.contended = subWidenAfter - 1
		done := make(chan struct{})
		go func() {
			defer close(done)
			p, err := a.take(256, s) // finds own held
			assert.NoError(t, err)
			assert.NoError(t, a.Deallocate(p, 256, s))
		}()
		time.Sleep(time.Duration(try+1) * time.Millisecond)
		c.own.mu.Unlock()
		<-done
	}
	assert.Len(t, c.all(), 8, "6 Ps: 8 shards")
	saCheck(t, a)
}

// Many goroutines on one stream whose cache has a shard per P (and a few
// on streams of their own), allocating and freeing, handing buffers to
// each other (so that frees come from other shards and streams), with
// Stats and Trim running meanwhile: no range is ever handed to two
// owners, and the books end empty. "pool" uses the real per-P hints (8
// Ps), "scattered" a random hint at each call, as if every goroutine
// moved between every two calls. Run under -race.
func TestSubAllocatorShardsConcurrent(t *testing.T) {
	for _, mode := range []string{"pool", "scattered"} {
		t.Run(mode, func(t *testing.T) {
			prev := runtime.GOMAXPROCS(8)
			defer runtime.GOMAXPROCS(prev)
			if mode == "scattered" {
				useHint(t, rand.Uint32)
			}
			a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: 256 * saKiB})
			shared := new(cuda.Stream)
			widenStream(t, a, shared, 8)
			const workers = 24
			var (
				mu    sync.Mutex
				owner = map[uint64]int{} // each live address, by goroutine
			)
			claim := func(g int, b *buffer.Buffer) error {
				mu.Lock()
				defer mu.Unlock()
				if o, dup := owner[uint64(b.Ptr())]; dup {
					return fmt.Errorf("goroutine %d got %#x, live in goroutine %d", g, uint64(b.Ptr()), o)
				}
				owner[uint64(b.Ptr())] = g
				return nil
			}
			release := func(b *buffer.Buffer) {
				mu.Lock()
				delete(owner, uint64(b.Ptr()))
				mu.Unlock()
			}
			handoff := make(chan *buffer.Buffer, workers)
			var wg, consumers sync.WaitGroup
			for g := range workers {
				own := shared
				if g%8 == 7 {
					own = new(cuda.Stream)
				}
				consumers.Add(1)
				go func() {
					defer consumers.Done()
					for b := range handoff {
						release(b)
						assert.NoError(t, b.CloseOn(own))
					}
				}()
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 9))
					var mine []*buffer.Buffer
					for i := range 1500 {
						size := []uint64{256, 256, 256, 1000, 4 * saKiB}[rng.IntN(5)]
						b, err := a.Allocate(size, own)
						if !assert.NoError(t, err) {
							return
						}
						if !assert.NoError(t, claim(g, b)) {
							return
						}
						switch {
						case rng.IntN(8) == 0:
							handoff <- b
						case rng.IntN(2) == 0:
							release(b)
							assert.NoError(t, b.Close())
						default:
							mine = append(mine, b)
						}
						if len(mine) > 6 || i == 1499 {
							for _, b := range mine {
								release(b)
								assert.NoError(t, b.Close())
							}
							mine = mine[:0]
						}
						if g == 0 && i%300 == 0 {
							_ = a.Stats()
							assert.NoError(t, a.Trim())
						}
					}
				}()
			}
			wg.Wait()
			close(handoff)
			consumers.Wait()
			assert.Empty(t, owner)
			saCheck(t, a)
			st := a.Stats()
			assert.Zero(t, st.Used)
			assert.Zero(t, st.Allocations)
			assert.Equal(t, st.Reserved, st.Free, "everything free after quiescence")
			require.NoError(t, a.Close())
			_, _, n := up.counts()
			assert.Zero(t, n, "the upstream has everything back")
		})
	}
}

// BenchmarkSubAllocatorSharedStream: 256-byte pairs (Allocate +
// Buffer.Close; "core": take + Deallocate, no Buffer) from GOMAXPROCS
// goroutines over the fake upstream, all on one stream ("shared") or each
// on its own ("own"): run it with -test.cpu 1,16,64 and compare pairs/s
// across the rows (ns/op is wall time per pair of all goroutines
// together). Issue 19's goals, on a 16-core host: shared-16 ≥ 2× shared-1,
// own at 64 goroutines ≥ 16× own-1 (BenchmarkSubAllocatorParallelFake
// runs fixed goroutine counts at any GOMAXPROCS, as cmd/cudamem bench
// does).
func BenchmarkSubAllocatorSharedStream(b *testing.B) {
	for _, mode := range []string{"shared", "own"} {
		for _, core := range []bool{false, true} {
			name := mode
			if core {
				name += "/core"
			}
			b.Run(name, func(b *testing.B) { fakePairs(b, runtime.GOMAXPROCS(0), mode == "shared", core) })
		}
	}
}
