package buffer_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// dropMixed allocates n Buffers from the resources and streams in turn,
// and drops them unclosed but for the odd ones, which it closes. It
// returns, by resource, the addresses and streams of the dropped ones.
//
//go:noinline
func dropMixed(t *testing.T, mrs []*fakeResource, streams []*cuda.Stream, n int) map[*fakeResource]map[cuda.DevicePtr]*cuda.Stream {
	want := map[*fakeResource]map[cuda.DevicePtr]*cuda.Stream{}
	for i := range n {
		mr, s := mrs[i%len(mrs)], streams[i/len(mrs)%len(streams)]
		b, err := buffer.Allocate(mr, 64, s)
		require.NoError(t, err)
		assert.Same(t, s, b.Stream())
		assert.Equal(t, buffer.MemoryResource(mr), b.Resource())
		if i%2 == 1 {
			require.NoError(t, b.Close())
			continue
		}
		if want[mr] == nil {
			want[mr] = map[cuda.DevicePtr]*cuda.Stream{}
		}
		want[mr][b.Ptr()] = s
	}
	return want
}

// The Buffers of a slab share homes (resource and stream) in the slab's
// side, eight at most; more resources and streams than that take more
// slabs. Each leaked Buffer is freed by its own resource, on its own
// stream, and a closed one is not freed again.
func TestLeaksManyHomesPerSlab(t *testing.T) {
	mrs := make([]*fakeResource, 7)
	for i := range mrs {
		mrs[i] = newFake()
	}
	streams := []*cuda.Stream{nil, new(cuda.Stream), new(cuda.Stream)} // never used: the fakes only record them
	leaks, kept := buffer.Leaks(), buffer.LeaksKept()
	buffer.FreshSlabs()
	const n = 300
	want := dropMixed(t, mrs, streams, n)
	buffer.FreshSlabs()
	expectedLeaks.Add(n / 2)
	collectUntil(t, "the leaked Buffers were not freed", func() bool {
		for _, mr := range mrs {
			if mr.liveCount() > 0 {
				return false
			}
		}
		return true
	})
	assert.Equal(t, leaks+n/2, buffer.Leaks())
	assert.Equal(t, kept, buffer.LeaksKept(), "each freed, none twice (the fakes refuse a second free)")
	for _, mr := range mrs {
		mr.mu.Lock()
		for i, p := range mr.freed {
			if s, ok := want[mr][p]; ok {
				assert.Same(t, s, mr.streams[i], "freed on its allocation stream")
			}
		}
		mr.mu.Unlock()
	}
}

// Cursors are per P: raising GOMAXPROCS adds cursors for the new Ps.
func TestAllocateAfterGOMAXPROCSGrows(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 6))
	mr := newFake()
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				b, err := buffer.Allocate(mr, 64, nil)
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, b.Close())
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, mr.liveCount())
}
