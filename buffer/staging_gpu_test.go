package buffer_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/internal/staging"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// Copies out of a device into fresh Go memory land the device's bytes
// under every staging setting the bench sweeps (prefault modes, eager or
// not, worker counts, pool shapes, huge pages), and copies in still
// arrive; every one of them is staged. The defaults are restored after.
func TestCopyToHostStagingVariants(t *testing.T) {
	d, s, k := gpu(t)
	def := staging.Current()
	t.Cleanup(func() { require.NoError(t, staging.Set(def)) })
	variants := []func(*staging.Params){
		func(p *staging.Params) { p.Prefault = staging.PrefaultOff; p.Eager = false; p.Ahead = 0 },
		func(p *staging.Params) { p.Prefault = staging.PrefaultTouch; p.Ahead = 0 },
		func(p *staging.Params) { p.Prefault = staging.PrefaultPopulate },
		func(p *staging.Params) { p.Prefault = staging.PrefaultPopulate; p.HugePages = true },
		func(p *staging.Params) { p.Prefault = staging.PrefaultPopulate; p.Ahead = 4; p.OutWorkers = 12 },
		func(p *staging.Params) { p.OutWorkers = 3; p.Chunks, p.ChunkSize = 8, 1<<20 },
		func(p *staging.Params) { p.OutWorkers = 16; p.Chunks, p.ChunkSize = 2, 4<<20; p.Eager = false },
		func(p *staging.Params) { p.Chunks = 1; p.MinBytes, p.OutMinBytes = 0, 0 },
	}
	const n = 21<<20 + 4097 // odd pieces at the end
	b := alloc(t, newResource(t, "device", d), n, s)
	for i, v := range variants {
		p := def
		v(&p)
		t.Run(fmt.Sprintf("%d/%v", i, p), func(t *testing.T) {
			require.NoError(t, staging.Set(p))
			seed := uint32(40 + i)
			require.NoError(t, k.Write(s, b.Ptr(), n, seed))
			before := buffer.StagedCopies()
			got := make([]byte, n) // fresh pages, most of them
			require.NoError(t, buffer.CopyToHost(got, b, s))
			requireBytes(t, cudatest.Pattern(n, seed), got)

			src := cudatest.Pattern(n, seed+100)
			require.NoError(t, buffer.CopyFromHost(b, src, s))
			k.RequireCheck(t, s, b.Ptr(), n, seed+100)
			assert.Equal(t, before+2, buffer.StagedCopies(), "both copies staged")
		})
	}
}

// The two ways have thresholds of their own: a copy is staged from its
// way's threshold up, and the bytes arrive either way.
func TestCopyHostThresholdPerWay(t *testing.T) {
	d, s, k := gpu(t)
	def := staging.Current()
	t.Cleanup(func() { require.NoError(t, staging.Set(def)) })
	const n = 1 << 20
	b := alloc(t, newResource(t, "device", d), n, s)
	for _, c := range []struct{ in, out int }{{0, 1 << 30}, {1 << 30, 0}, {n, n + 1}} {
		p := def
		// A fresh destination would be staged from FreshMinBytes
		// (TestCopyToHostFreshThreshold): here it is the way's own.
		p.MinBytes, p.OutMinBytes, p.FreshMinBytes = c.in, c.out, c.out
		require.NoError(t, staging.Set(p))
		before := buffer.StagedCopies()
		src := cudatest.Pattern(n, 3)
		require.NoError(t, buffer.CopyFromHost(b, src, s))
		k.RequireCheck(t, s, b.Ptr(), n, 3)
		staged := buffer.StagedCopies() - before
		got := make([]byte, n)
		require.NoError(t, buffer.CopyToHost(got, b, s))
		requireBytes(t, src, got)
		wantIn, wantOut := int64(0), int64(0)
		if n >= c.in {
			wantIn = 1
		}
		if n >= c.out {
			wantOut = 1
		}
		assert.Equal(t, wantIn, staged, "into the device, thresholds %d/%d", c.in, c.out)
		assert.Equal(t, wantOut, buffer.StagedCopies()-before-staged, "out of the device, thresholds %d/%d", c.in, c.out)
	}
}
