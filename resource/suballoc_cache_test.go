package resource

// CPU tests of the SubAllocator's per-stream caches, over the fake
// upstream and orderer of suballoc_test.go.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// cached returns the free ranges of s's cache, by address.
func cached(a *SubAllocator, s *cuda.Stream) []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.cacheMap[s]
	if c == nil {
		return nil
	}
	var out []uint64
	for _, sh := range c.all() {
		sh.mu.Lock()
		for _, e := range sh.free {
			out = append(out, e.addr)
		}
		sh.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// A range freed on a stream is reused on that stream at once, from its
// cache, with no ordering; another stream never gets it without being
// ordered after the first.
func TestSubAllocatorCacheStreamOrdered(t *testing.T) {
	a, _, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	s1, s2 := new(cuda.Stream), new(cuda.Stream)

	p, err := a.take(4*saKiB, s1)
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, 4*saKiB, s1))
	assert.Equal(t, []uint64{uint64(p)}, cached(a, s1), "freed into s1's cache")
	saCheck(t, a)

	// s2 takes other memory (after ordering itself after s1, whose list
	// holds the rest of the block), never the range s1's cache holds.
	q, err := a.take(4*saKiB, s2)
	require.NoError(t, err)
	assert.NotEqual(t, p, q)
	assert.Equal(t, [][2]*cuda.Stream{{s2, s1}}, o.waits)
	assert.Equal(t, []uint64{uint64(p)}, cached(a, s1))

	// s1 gets its range back, no wait.
	p2, err := a.take(4*saKiB, s1)
	require.NoError(t, err)
	assert.Equal(t, p, p2)
	assert.Len(t, o.waits, 1)
	assert.Empty(t, cached(a, s1))

	// Allocated on s1, freed on s2: the range is s2's, in the shared
	// books (s2's list), not in s1's cache nor s2's.
	a.mu.Lock()
	before := a.lists[s2].bytes
	a.mu.Unlock()
	require.NoError(t, a.Deallocate(p2, 4*saKiB, s2))
	assert.Empty(t, cached(a, s1))
	assert.Empty(t, cached(a, s2))
	a.mu.Lock()
	assert.Equal(t, before+4*saKiB, a.lists[s2].bytes, "on s2's list")
	a.mu.Unlock()
	saCheck(t, a)
	require.NoError(t, a.Deallocate(q, 4*saKiB, s2))
	st := a.Stats()
	assert.Zero(t, st.Used)
	assert.Zero(t, st.Allocations)
	assert.Empty(t, cached(a, s2), "Stats flushed the caches")
}

// Frees the cache checks without the shared lock are refused as the
// shared books refuse them, and change nothing.
func TestSubAllocatorCacheBadFrees(t *testing.T) {
	a, _, _ := newSA(t, nil)
	defer func() { assert.NoError(t, a.Close()) }()
	s, other := new(cuda.Stream), new(cuda.Stream)
	p, err := a.take(1000, s)
	require.NoError(t, err)

	err = a.Deallocate(p, 2000, s) // wrong size, on the cache's stream
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "2000 bytes given, the allocation has 1024")
	require.NoError(t, a.Deallocate(p, 1000, s))
	for _, on := range []*cuda.Stream{s, other, nil} {
		err = a.Deallocate(p, 1000, on) // a double free, the range in s's cache
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "on %v", on)
		assert.Contains(t, err.Error(), "already freed")
	}
	assert.Equal(t, []uint64{uint64(p)}, cached(a, s))
	err = a.Deallocate(p+256, 768, s) // inside a cached range
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	saCheck(t, a)
	assert.Zero(t, a.Stats().Allocations)
}

// Cached ranges do not make the sub-allocator grow: before it takes a new
// block (here: beyond MaxSize) every cache goes back to the books, where
// the ranges coalesce and another stream can take them, ordered.
func TestSubAllocatorCacheNoGrowthWhileFree(t *testing.T) {
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, MaxSize: saMiB})
	defer func() { assert.NoError(t, a.Close()) }()
	s1, s2 := new(cuda.Stream), new(cuda.Stream)
	var ps []cuda.DevicePtr
	for range 16 {
		p, err := a.take(64*saKiB, s1)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for _, p := range ps {
		require.NoError(t, a.Deallocate(p, 64*saKiB, s1))
	}
	assert.Len(t, cached(a, s1), 4, "a quarter of GrowSize cached, the rest in the books")
	p, err := a.take(saMiB, s2)
	require.NoError(t, err, "the whole block, coalesced from s1's cache and list")
	assert.Equal(t, [][2]*cuda.Stream{{s2, s1}}, o.waits)
	allocs, _, _ := up.counts()
	assert.Equal(t, 1, allocs)
	require.NoError(t, a.Deallocate(p, saMiB, s2))
}

// Trim gives back blocks whose only ranges sit in caches, and forgets
// caches with nothing handed out; Close does too and leaves no fast path.
func TestSubAllocatorCacheTrimClose(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s1, s2 := new(cuda.Stream), new(cuda.Stream)
	p, err := a.take(saKiB, s1)
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, saKiB, s1))
	keep, err := a.take(saKiB, s2) // s2 orders after s1 and takes its list
	require.NoError(t, err)
	require.Len(t, cached(a, s1), 1)

	require.NoError(t, a.Trim())
	a.mu.Lock()
	_, has1 := a.cacheMap[s1]
	_, has2 := a.cacheMap[s2]
	a.mu.Unlock()
	assert.False(t, has1, "nothing handed out on s1: its cache is forgotten")
	assert.True(t, has2, "s2 has an allocation out")
	assert.Equal(t, 1, a.Stats().Blocks, "the block holds s2's allocation")

	require.ErrorIs(t, a.Close(), cuda.ErrorIllegalState)
	_, err = a.take(saKiB, s2)
	require.ErrorIs(t, err, cuda.ErrClosed, "no fast path after Close")
	require.NoError(t, a.Deallocate(keep, saKiB, s2)) // the last one: the block goes back
	_, _, live := up.counts()
	assert.Zero(t, live)
	assert.Zero(t, a.Stats())
}

// Many goroutines, each allocating on its own stream or a shared one, and
// handing half of their buffers to other goroutines, which close them on
// their own streams: the allocations live at once are disjoint and inside
// blocks the upstream handed out; at the end the books are empty and the
// upstream gets everything back. Run under -race.
func TestSubAllocatorConcurrentHandoff(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: 256 * saKiB})
	const (
		workers = 16
		rounds  = 400
	)
	shared := new(cuda.Stream)
	var (
		mu   sync.Mutex
		live = map[uint64]uint64{} // address → size of every allocation out
	)
	claim := func(b *buffer.Buffer) error {
		p, n := uint64(b.Ptr()), b.Size()
		up.mu.Lock()
		inBlock := false
		for bp, bn := range up.live {
			if p >= uint64(bp) && p+n <= uint64(bp)+bn {
				inBlock = true
				break
			}
		}
		up.mu.Unlock()
		if !inBlock {
			return fmt.Errorf("%#x (%d bytes) is in no upstream block", p, n)
		}
		mu.Lock()
		defer mu.Unlock()
		for q, m := range live {
			if p < q+m && q < p+n {
				return fmt.Errorf("%#x (%d bytes) overlaps %#x (%d bytes)", p, n, q, m)
			}
		}
		live[p] = n
		return nil
	}
	release := func(b *buffer.Buffer) {
		mu.Lock()
		delete(live, uint64(b.Ptr()))
		mu.Unlock()
	}
	handoff := make(chan *buffer.Buffer, workers*4)
	var wg, consumers sync.WaitGroup
	for g := range workers {
		own := new(cuda.Stream)
		if g%4 == 3 {
			own = shared
		}
		// A consumer per worker: closes what others hand over, on its own
		// stream.
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
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var mine []*buffer.Buffer
			for i := range rounds {
				size := []uint64{256, 1000, 4 * saKiB, 16*saKiB + 1}[rng.IntN(4)]
				b, err := a.Allocate(size, own)
				if !assert.NoError(t, err) {
					return
				}
				if !assert.NoError(t, claim(b)) {
					return
				}
				if rng.IntN(2) == 0 {
					handoff <- b
				} else {
					mine = append(mine, b)
				}
				if len(mine) > 8 || i == rounds-1 {
					for _, b := range mine {
						release(b)
						assert.NoError(t, b.Close())
					}
					mine = mine[:0]
				}
				if g == 0 && i%100 == 0 {
					_ = a.Stats()
					assert.NoError(t, a.Trim())
				}
			}
		}()
	}
	wg.Wait()
	close(handoff)
	consumers.Wait()
	assert.Empty(t, live)
	saCheck(t, a)
	st := a.Stats()
	assert.Zero(t, st.Used)
	assert.Zero(t, st.Allocations)
	require.NoError(t, a.Close())
	_, _, n := up.counts()
	assert.Zero(t, n, "the upstream has everything back")
}
