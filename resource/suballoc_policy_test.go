package resource

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

const policyChunk = 2 << 20

// newPolicySA is newSA with chunk-sized growth and the policy p.
func newPolicySA(t testing.TB, p ReleasePolicy) (*SubAllocator, *saUpstream, *saOrder) {
	return newSA(t, &SubAllocatorOptions{GrowSize: policyChunk, Release: &p})
}

// TestReleasePolicyFollowsLive replays random allocations and frees with
// the zero policy: at every step the memory held from the upstream is at
// most the live allocations each rounded up to a chunk (a chunk-sized
// block holds at least one of them, a larger block exactly one), the
// upstream agrees, and once everything is freed nothing is held.
func TestReleasePolicyFollowsLive(t *testing.T) {
	a, up, _ := newPolicySA(t, ReleasePolicy{})
	defer a.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	s := []*cuda.Stream{nil, new(cuda.Stream)}
	type live struct {
		b *buffer.Buffer
		n uint64
	}
	var lives []live
	bound := func() (n uint64) {
		for _, l := range lives {
			n += (l.n + policyChunk - 1) &^ (policyChunk - 1)
		}
		return n
	}
	for step := range 4000 {
		if len(lives) > 0 && (rng.IntN(2) == 0 || len(lives) > 200) {
			k := rng.IntN(len(lives))
			require.NoError(t, lives[k].b.Close())
			lives[k] = lives[len(lives)-1]
			lives = lives[:len(lives)-1]
		} else {
			n := uint64(1 + rng.IntN(1<<rng.IntN(24)))
			b, err := a.Allocate(n, s[rng.IntN(2)])
			require.NoError(t, err)
			lives = append(lives, live{b, n})
		}
		st := a.Stats()
		require.LessOrEqual(t, st.Reserved, bound(), "step %d: held %d for %d live", step, st.Reserved, len(lives))
		up.mu.Lock()
		require.Equal(t, st.Reserved, up.held, "step %d", step)
		up.mu.Unlock()
	}
	for _, l := range lives {
		require.NoError(t, l.b.Close())
	}
	st := a.Stats()
	assert.Zero(t, st.Reserved)
	assert.Zero(t, st.Blocks)
	assert.NotZero(t, a.PeakReserved())
	_, _, n := up.counts()
	assert.Zero(t, n, "upstream allocations live after every free")
}

// TestReleasePolicyKeepFree: chunk-sized blocks stay free up to KeepFree,
// a block larger than GrowSize goes back at once whatever the budget.
func TestReleasePolicyKeepFree(t *testing.T) {
	a, up, o := newPolicySA(t, ReleasePolicy{KeepFree: policyChunk})
	defer a.Close()
	s := new(cuda.Stream)
	small1, err := a.Allocate(policyChunk, s)
	require.NoError(t, err)
	small2, err := a.Allocate(policyChunk, s)
	require.NoError(t, err)
	big, err := a.Allocate(3*policyChunk, s)
	require.NoError(t, err)
	require.Equal(t, uint64(5*policyChunk), a.Stats().Reserved)

	require.NoError(t, big.Close())
	assert.Equal(t, uint64(2*policyChunk), a.Stats().Reserved, "a large block is never kept")
	o.mu.Lock()
	assert.Equal(t, []*cuda.Stream{s}, o.syncs, "the stream that freed into the block is waited for before it goes")
	o.mu.Unlock()
	require.NoError(t, small1.Close())
	assert.Equal(t, uint64(2*policyChunk), a.Stats().Reserved, "one chunk fits the budget")
	require.NoError(t, small2.Close())
	assert.Equal(t, uint64(policyChunk), a.Stats().Reserved, "the second goes beyond it")

	// The kept block serves the next allocation without the upstream.
	allocs, _, _ := up.counts()
	b, err := a.Allocate(4096, s)
	require.NoError(t, err)
	again, _, _ := up.counts()
	assert.Equal(t, allocs, again)
	require.NoError(t, b.Close())
	require.NoError(t, a.Trim())
	assert.Zero(t, a.Stats().Reserved)
}

// TestReleasePolicyThreshold: nothing goes back while the reserve is at
// most Threshold; above it, free blocks go back down to it.
func TestReleasePolicyThreshold(t *testing.T) {
	a, _, _ := newPolicySA(t, ReleasePolicy{Threshold: 2 * policyChunk})
	defer a.Close()
	var bs []*buffer.Buffer
	for range 4 {
		b, err := a.Allocate(policyChunk, nil)
		require.NoError(t, err)
		bs = append(bs, b)
	}
	require.NoError(t, bs[0].Close())
	assert.Equal(t, uint64(3*policyChunk), a.Stats().Reserved)
	require.NoError(t, bs[1].Close())
	assert.Equal(t, uint64(2*policyChunk), a.Stats().Reserved)
	require.NoError(t, bs[2].Close())
	require.NoError(t, bs[3].Close())
	assert.Equal(t, uint64(2*policyChunk), a.Stats().Reserved, "kept at the threshold")
}

// TestReleasePolicyFailures: a block the upstream refuses to take back,
// or whose streams cannot be waited for, stays usable; the free itself
// succeeded; Close retries and reports; the Released hook sees the block
// once. The Close that freed the range says it is done, but not tidy.
func TestReleasePolicyFailures(t *testing.T) {
	var released []cuda.DevicePtr
	p := ReleasePolicy{}
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: policyChunk, Release: &p, Segments: &SegmentHooks{
		Released: func(ptr cuda.DevicePtr, _ uint64) error { released = append(released, ptr); return nil },
	}})
	s := new(cuda.Stream)

	o.syncErr = errors.New("sync refused")
	b, err := a.Allocate(100, s)
	require.NoError(t, err)
	err = b.Close()
	require.ErrorIs(t, err, buffer.ErrPartlyFreed, "the range is freed whatever happens to its block")
	assert.True(t, b.IsClosed())
	assert.Equal(t, uint64(policyChunk), a.Stats().Reserved)
	assert.Empty(t, released)
	o.syncErr = nil

	// The block stayed usable, and the next fall gives it back.
	b, err = a.Allocate(100, s)
	require.NoError(t, err)
	refuse := errors.New("free refused")
	up.mu.Lock()
	up.freeErr = func(*cuda.Stream) error { return refuse }
	up.mu.Unlock()
	require.ErrorIs(t, b.Close(), refuse)
	assert.Equal(t, uint64(policyChunk), a.Stats().Reserved, "refused by the upstream: kept")
	up.mu.Lock()
	up.freeErr = nil
	up.mu.Unlock()

	err = a.Close()
	require.NoError(t, err, "Close retries and succeeds; the old error is superseded")
	assert.Zero(t, a.Stats().Reserved)
	_, _, n := up.counts()
	assert.Zero(t, n)
	assert.Len(t, released, 2, "Released ran for the failed free (before the upstream refused) and for the last one")
}

// BenchmarkReleasePolicyPairFake is BenchmarkSubAllocatorPairFake's pair
// with a release policy that keeps the block (the steady state of a
// pool that serves one size), beside the pair without a policy.
func BenchmarkReleasePolicyPairFake(b *testing.B) {
	for _, c := range []struct {
		name string
		p    *ReleasePolicy
	}{{"none", nil}, {"keep", &ReleasePolicy{KeepFree: 16 << 20}}} {
		b.Run(c.name, func(b *testing.B) {
			a, _, _ := newSA(b, &SubAllocatorOptions{GrowSize: policyChunk, Release: c.p})
			defer a.Close()
			s := new(cuda.Stream)
			b.ReportAllocs()
			for b.Loop() {
				buf, err := a.Allocate(256, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := buf.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
