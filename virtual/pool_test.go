package virtual_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// TestPoolFake runs the pool's GPU tests over the fake driver, so that
// they run on machines without a GPU.
func TestPoolFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestGPUPoolFollowsLive", "TestGPUPoolRefusals")
}

func newPool(t *testing.T, d *cuda.Device, o *virtual.PoolOptions) (*resource.SubAllocator, uint64) {
	t.Helper()
	p, err := virtual.NewPool(d, o)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	return p, p.Upstream().(*virtual.Resource).Granularity()
}

// TestGPUPoolFollowsLive replays random allocations and frees on a pool
// that keeps no free memory: data written to each allocation reads back
// intact when it is freed; at every step the memory mapped is at most the
// live allocations each rounded up to a chunk; each block mapped and
// unmapped passes the segment hooks once; and when everything is freed
// nothing is mapped and the device's free memory is back.
func TestGPUPoolFollowsLive(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	var acquired, released int
	var mapped uint64
	p, gran := newPool(t, d, &virtual.PoolOptions{
		Release: &resource.ReleasePolicy{},
		Segments: &resource.SegmentHooks{
			Acquired: func(_ cuda.DevicePtr, n uint64) error { acquired++; mapped += n; return nil },
			Released: func(_ cuda.DevicePtr, n uint64) error { released++; mapped -= n; return nil },
		},
	})
	free0, _, err := d.MemInfo()
	require.NoError(t, err)

	type live struct {
		b    *buffer.Buffer
		n    uint64
		seed uint32
	}
	var lives []live
	rounded := func() (n uint64) {
		for _, l := range lives {
			n += (l.n + gran - 1) / gran * gran
		}
		return n
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var peakLive uint64
	for step := range 400 {
		if len(lives) > 0 && (rng.IntN(2) == 0 || len(lives) > 40) {
			i := rng.IntN(len(lives))
			l := lives[i]
			k.RequireCheck(t, s, l.b.Ptr(), l.n, l.seed)
			require.NoError(t, l.b.Close())
			lives[i] = lives[len(lives)-1]
			lives = lives[:len(lives)-1]
		} else {
			n := uint64(4 + 4*rng.IntN(1<<rng.IntN(22)))
			b, err := p.Allocate(n, s)
			require.NoError(t, err)
			seed := uint32(step + 1)
			require.NoError(t, k.Write(s, b.Ptr(), n, seed))
			lives = append(lives, live{b, n, seed})
		}
		st := p.Stats()
		require.LessOrEqual(t, st.Reserved, rounded(), "step %d: %d bytes mapped for %d live allocations", step, st.Reserved, len(lives))
		require.Equal(t, st.Reserved, mapped, "step %d: the hooks saw every block", step)
		peakLive = max(peakLive, rounded())
	}
	for _, l := range lives {
		k.RequireCheck(t, s, l.b.Ptr(), l.n, l.seed)
		require.NoError(t, l.b.Close())
	}
	st := p.Stats()
	assert.Zero(t, st.Reserved, "nothing mapped once everything is freed")
	assert.LessOrEqual(t, p.PeakReserved(), peakLive)
	assert.Equal(t, acquired, released)
	assert.NotZero(t, acquired)
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	// Other processes may allocate meanwhile on a shared GPU: allow a
	// chunk of drift, far less than the pool's peak.
	assert.GreaterOrEqual(t, free1+gran, free0, "the device's free memory is back (%d before, %d after)", free0, free1)
	require.NoError(t, p.Close())
	assert.Empty(t, p.Upstream().(*virtual.Resource).Live())
}

// TestGPUPoolRefusals: bad options name themselves; a capturing stream is
// refused rather than captured (mapping is not stream-ordered); the
// pool's buffers are not exportable; the default policy keeps a freed
// chunk for the next allocation.
func TestGPUPoolRefusals(t *testing.T) {
	d := cudatest.Device(t)
	_, err := virtual.NewPool(d, &virtual.PoolOptions{Memory: &virtual.Options{Reserve: 1 << 30}})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorContains(t, err, "Reserve")
	_, err = virtual.NewPool(nil, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)

	p, gran := newPool(t, d, nil)
	defer func() { require.NoError(t, p.Close()) }()
	s := cudatest.Stream(t, d)
	require.NoError(t, s.BeginCapture())
	_, err = p.Allocate(4096, s)
	assert.ErrorIs(t, err, cuda.ErrCapturing)
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())

	b, err := p.Allocate(4096, s)
	require.NoError(t, err)
	_, err = p.Upstream().(*virtual.Resource).Export(b)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a pool's buffer is not a Resource allocation")
	require.NoError(t, b.Close())
	assert.Equal(t, gran, p.Stats().Reserved, "DefaultPoolKeepFree keeps the chunk")
	b, err = p.Allocate(gran, s)
	require.NoError(t, err)
	assert.Equal(t, gran, p.Stats().Reserved, "and reuses it")
	require.NoError(t, b.Close())
	require.NoError(t, p.Trim())
	assert.Zero(t, p.Stats().Reserved)
}

// BenchmarkPoolPair: a 256-byte Allocate + Close on one stream, on the
// pool (which keeps its one block mapped) beside a SubAllocator over a
// DevicePool, in the same run. Neither calls the driver in steady state.
func BenchmarkPoolPair(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	vp, err := virtual.NewPool(d, nil)
	cudatest.SkipIfNotSupported(b, err)
	require.NoError(b, err)
	defer vp.Close()
	dp, err := resource.NewDevicePool(d, nil)
	require.NoError(b, err)
	defer dp.Close()
	sa, err := resource.NewSubAllocator(dp, nil)
	require.NoError(b, err)
	defer sa.Close()
	for _, c := range []struct {
		name string
		mr   *resource.SubAllocator
	}{{"vpool", vp}, {"suballoc", sa}, {"vpool-again", vp}, {"suballoc-again", sa}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf, err := c.mr.Allocate(256, s)
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

// Hooks on the chunks' Options would be replaced by the pool's own:
// NewPool refuses them rather than drop them, before any driver call.
func TestPoolRefusesMemorySegments(t *testing.T) {
	_, err := virtual.NewPool(nil, &virtual.PoolOptions{Memory: &virtual.Options{Segments: &resource.SegmentHooks{}}})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorContains(t, err, "Memory.Segments must be nil")
}
