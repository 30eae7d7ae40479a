//go:build linux

package ipc_test

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/ipc"
)

// TestIpcImportedPoolCloseRace: a child closes its imported pool while
// goroutines import buffers from it (the pool lifecycle shared with
// resource.DevicePool). Every Import either returns a Buffer with the
// exporter's data or fails with ErrClosed; Buffers outlive the pool's
// Close, and importing the pool again is refused while they are open; the
// pool is destroyed after the last, after which the same pool imports
// afresh. The parent's data and pool are untouched.
func TestIpcImportedPoolCloseRace(t *testing.T) {
	const n, seed = 4, 90
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, n, bufSize, seed)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "close-race", poolEnv(t, h, seed, descs...), f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), bufSize, uint32(seed+i))
		require.NoError(t, b.Close())
	}
	require.NoError(t, s.Sync())
	attrs, err := p.Attributes()
	require.NoError(t, err)
	assert.Zero(t, attrs.UsedMemCurrent)
}

func roleCloseRace(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	fds := childFDs(t)
	p, h := importFromEnv(t, d)
	descs := decode(t, os.Getenv(envDescs))
	require.NotEmpty(t, descs)
	// Open through the pool's Close whatever the goroutines manage.
	first, err := p.Import(descs[0], s)
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		kept  []*buffer.Buffer
		which []int
	)
	start := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range 2000 { // bounded, should Close come late
				j := (g + i) % len(descs)
				b, err := p.Import(descs[j], s)
				if err != nil {
					assert.ErrorIs(t, err, cuda.ErrClosed)
					return
				}
				m, err := k.Check(s, b.Ptr(), descs[j].Size, uint32(seed+j))
				assert.NoError(t, err)
				assert.Zero(t, m, "buffer %d", j)
				if i%2 == 0 {
					assert.NoError(t, b.Close())
					continue
				}
				mu.Lock()
				kept, which = append(kept, b), append(which, j)
				mu.Unlock()
			}
		}()
	}
	close(start)
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, p.Close())
	assert.True(t, p.IsClosed())
	wg.Wait()
	t.Logf("%d Buffers open after the pool's Close", len(kept)+1)
	k.RequireCheck(t, s, first.Ptr(), descs[0].Size, uint32(seed))
	// Importing the pool again while its Buffers are open is refused: the
	// driver could hand the new pool the very mappings they use.
	again, err := ipc.ImportPool(d, h)
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Nil(t, again)
	_, ok := ipc.Lookup(h.UUID())
	assert.False(t, ok, "Lookup returns open pools only")
	for i, b := range kept {
		k.RequireCheck(t, s, b.Ptr(), descs[which[i]].Size, uint32(seed+which[i]))
	}
	for _, b := range kept {
		require.NoError(t, b.Close())
	}
	require.NoError(t, first.Close(), "the last Buffer destroys the closed pool")
	assert.Zero(t, p.Live())
	require.NoError(t, p.Close(), "nothing deferred failed")

	// The old mapping is gone; the same pool imports afresh.
	p2, err := ipc.ImportPool(d, h)
	require.NoError(t, err)
	assert.NotSame(t, p, p2)
	b, err := p2.Import(descs[0], s)
	require.NoError(t, err)
	k.RequireCheck(t, s, b.Ptr(), descs[0].Size, uint32(seed))
	require.NoError(t, b.Close())
	require.NoError(t, p2.Close())
	require.NoError(t, h.Close())
	testutil.AssertNoNewFDs(t, fds, "fds back to baseline in the child")
}
