package buffer_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// closedStreams is a fake resource whose streams are all closed: a free
// on a stream fails with an error matching cuda.ErrClosed, and only a
// free on the default stream (nil) reaches the fake's books.
type closedStreams struct{ *fakeResource }

func (m closedStreams) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if s != nil {
		return fmt.Errorf("fake: free of %#x on a closed stream: %w", uint64(p), cuda.ErrClosed)
	}
	return m.fakeResource.Deallocate(p, size, s)
}

// The safety net counts in LeaksKept only the leaks whose memory stays
// allocated. A free whose error wraps ErrPartlyFreed gave the memory back
// (it was counted kept before), on the allocation stream or on the default
// stream it falls back to when that one is closed; a free refused outright
// keeps the memory, and is counted.
func TestLeaksKeptCountsOnlyMemoryLeftAllocated(t *testing.T) {
	for _, tc := range []struct {
		name     string
		onStream bool // allocated on a (closed) stream: the net falls back to the default one
		partly   int  // frees that free, then fail with ErrPartlyFreed
		fail     int  // frees that fail, freeing nothing
		panics   int  // frees that panic (a user's resource), freeing nothing
		kept     bool
	}{
		{name: "panicked", panics: 1, kept: true},
		{name: "partly freed", partly: 1},
		{name: "partly freed on the fallback", onStream: true, partly: 1},
		{name: "refused", fail: 1, kept: true},
		{name: "refused on the fallback", onStream: true, fail: 1, kept: true},
		{name: "freed"},
		{name: "freed on the fallback", onStream: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake()
			var mr buffer.MemoryResource = fake
			var s *cuda.Stream
			if tc.onStream {
				mr, s = closedStreams{fake}, new(cuda.Stream)
			}
			p, _, err := fake.AllocatePtr(64, s)
			require.NoError(t, err)
			fake.mu.Lock()
			fake.partlyFrees, fake.failFrees, fake.panicFrees = tc.partly, tc.fail, tc.panics
			fake.mu.Unlock()

			leaks, kept := buffer.Leaks(), buffer.LeaksKept()
			buffer.CollectOne(mr, p, 64, s)
			expectedLeaks.Add(1)
			assert.Equal(t, leaks+1, buffer.Leaks(), "a leak either way")
			if tc.kept {
				assert.Equal(t, kept+1, buffer.LeaksKept(), "the memory stays allocated")
				assert.Equal(t, 1, fake.liveCount())
				return
			}
			assert.Equal(t, kept, buffer.LeaksKept(), "the memory was given back")
			assert.Zero(t, fake.liveCount())
			assert.Len(t, fake.freed, 1)
		})
	}
}

// The free the net and the last Hold's Release make: when the fallback to
// the default stream freed the memory and then failed, the error says so
// (wraps ErrPartlyFreed), so that Release does not keep the hold for a
// retry that would free the memory twice; it still names the first
// failure.
func TestFreeOrFallbackReportsTheFallback(t *testing.T) {
	fake := newFake()
	mr := closedStreams{fake}
	p, _, err := fake.AllocatePtr(32, nil)
	require.NoError(t, err)
	fake.partlyFrees = 1
	err = buffer.FreeOrFallback(mr, p, 32, new(cuda.Stream))
	require.Error(t, err)
	assert.ErrorIs(t, err, buffer.ErrPartlyFreed)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "closed stream")
	assert.Contains(t, err.Error(), "bookkeeping failed")
	assert.Zero(t, fake.liveCount())

	// A fallback that frees nothing: not ErrPartlyFreed, still allocated.
	p, _, err = fake.AllocatePtr(32, nil)
	require.NoError(t, err)
	fake.failFrees = 1
	err = buffer.FreeOrFallback(mr, p, 32, new(cuda.Stream))
	require.Error(t, err)
	assert.NotErrorIs(t, err, buffer.ErrPartlyFreed)
	assert.ErrorIs(t, err, errFakeFree)
	assert.Equal(t, 1, fake.liveCount())
	require.NoError(t, buffer.FreeOrFallback(mr, p, 32, new(cuda.Stream)))
	assert.Zero(t, fake.liveCount())
}

// closedKept keeps closed Buffers reachable past their test.
var closedKept []*buffer.Buffer

// A resource whose Buffers are all closed is collected, though the closed
// Buffers stay reachable: a closed Buffer reaches nothing, and the cursors
// give up their homes at the next collection. (When a closed Buffer, or
// its slab, kept its resource, an arena holding a block Buffer was never
// collected.)
func TestClosedBuffersKeepNoResource(t *testing.T) {
	var gone atomic.Bool
	func() {
		mr := newFake()
		runtime.AddCleanup(mr, func(g *atomic.Bool) { g.Store(true) }, &gone)
		for range 10 {
			b := mr.alloc(64)
			require.NoError(t, b.Close())
			closedKept = append(closedKept, b)
		}
	}()
	collectUntil(t, "a resource whose Buffers are all closed was not collected", gone.Load)
	assert.Nil(t, closedKept[0].Resource())
}

// countingResource hands out addresses and allocates nothing itself.
type countingResource struct {
	next atomic.Uint64
	live atomic.Int64
}

func (m *countingResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	m.live.Add(1)
	return cuda.DevicePtr(m.next.Add(1<<20) + 1<<40), s, nil
}

func (m *countingResource) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error {
	m.live.Add(-1)
	return nil
}
func (m *countingResource) DeviceAccessible() bool { return true }
func (m *countingResource) HostAccessible() bool   { return false }
func (m *countingResource) DeviceID() int          { return 0 }

// Pairs that alternate between resources and streams reuse the homes their
// P's cursor keeps: a pair allocates its Buffer's slot (40 bytes on 64-bit
// targets), not a home each time the resource or stream changes.
func TestAlternatingPairsShareHomes(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one P: one cursor
	m1, m2 := new(countingResource), new(countingResource)
	s1, s2 := new(cuda.Stream), new(cuda.Stream)
	ways := []struct {
		mr *countingResource
		s  *cuda.Stream
	}{{m1, s1}, {m1, s2}, {m2, s1}}
	pair := func(i int) {
		w := ways[i%len(ways)]
		b, err := buffer.Allocate(w.mr, 256, w.s)
		require.NoError(t, err)
		assert.Same(t, w.s, b.Stream())
		require.NoError(t, b.Close())
	}
	for i := range 3000 {
		pair(i) // warm up
	}
	const pairs = 30000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range pairs {
		pair(i)
	}
	runtime.ReadMemStats(&after)
	perPair := float64(after.TotalAlloc-before.TotalAlloc) / pairs
	assert.LessOrEqual(t, perPair, 48.0, "bytes a pair")
	assert.Zero(t, m1.live.Load()+m2.live.Load())
}
