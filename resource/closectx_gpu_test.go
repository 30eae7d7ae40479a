package resource_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// queueLongWork queues about n fills of 1 GiB on s (tens of milliseconds
// to a few hundred on an H200), so a wait on s outlasts a short deadline.
func queueLongWork(t *testing.T, d *cuda.Device, s *cuda.Stream, n int) {
	t.Helper()
	const size = 1 << 30
	p, err := d.MemAlloc(size)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, s.Sync())
		require.NoError(t, d.MemFree(p))
	})
	for i := range n {
		require.NoError(t, s.MemsetD32Async(p, uint32(i), size/4))
	}
}

// closeContextPool is what the pool CloseContext tests need of a pool.
type closeContextPool interface {
	buffer.MemoryResource
	CloseContext(ctx context.Context) error
	IsClosed() bool
}

// checkPoolCloseContext frees a buffer of p on s behind long work, then
// checks that CloseContext with a short deadline gives up with the pool
// still open and usable, and that with a live context it closes once the
// work is done.
func checkPoolCloseContext(t *testing.T, d *cuda.Device, p closeContextPool, name string) {
	s := cudatest.Stream(t, d)
	b, err := buffer.Allocate(p, 1<<20, s)
	require.NoError(t, err)
	queueLongWork(t, d, s, 400)
	require.NoError(t, b.Close()) // freed in stream order, after the work

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	err = p.CloseContext(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), name+".CloseContext")
	done, err := s.Done()
	require.NoError(t, err)
	assert.False(t, done, "CloseContext gave up before the work finished")
	assert.False(t, p.IsClosed(), "still open after the deadline")
	b2, err := buffer.Allocate(p, 4096, s)
	require.NoError(t, err, "the pool still allocates")
	require.NoError(t, b2.Close())

	require.NoError(t, p.CloseContext(context.Background()))
	done, err = s.Done()
	require.NoError(t, err)
	assert.True(t, done, "CloseContext returned nil only after the work finished")
	assert.True(t, p.IsClosed())
	_, err = buffer.Allocate(p, 1, s)
	assert.ErrorIs(t, err, cuda.ErrClosed)
}

func TestDevicePoolCloseContextGPU(t *testing.T) {
	d := cudatest.Device(t)
	p, err := resource.NewDevicePool(d, nil)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	checkPoolCloseContext(t, d, p, "DevicePool")
}

func TestPinnedPoolCloseContextGPU(t *testing.T) {
	d := cudatest.Device(t)
	p, err := resource.NewPinnedPool(nil)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	checkPoolCloseContext(t, d, p, "PinnedPool")
}

// SubAllocator.TrimContext and CloseContext wait for the streams of the
// frees it holds: with a short deadline nothing is given back and the
// sub-allocator stays open; with a live context Trim gives its blocks back
// and Close closes.
func TestSubAllocatorCloseContextGPU(t *testing.T) {
	d := cudatest.Device(t)
	up := ownedPool(t, d, nil)
	checkLeaks(t, up, d)
	a, err := resource.NewSubAllocator(up, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	s := cudatest.Stream(t, d)

	b, err := a.Allocate(1<<20, s)
	require.NoError(t, err)
	queueLongWork(t, d, s, 400)
	require.NoError(t, b.Close()) // held by the sub-allocator, pending on s
	reserved := a.Stats().Reserved
	require.NotZero(t, reserved)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	err = a.TrimContext(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "SubAllocator.TrimContext")
	assert.Equal(t, reserved, a.Stats().Reserved, "nothing given back after the deadline")
	err = a.CloseContext(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "SubAllocator.CloseContext")
	assert.False(t, a.IsClosed(), "still open after the deadline")
	done, err := s.Done()
	require.NoError(t, err)
	assert.False(t, done, "the waits gave up before the work finished")

	require.NoError(t, a.TrimContext(context.Background()))
	done, err = s.Done()
	require.NoError(t, err)
	assert.True(t, done, "TrimContext returned nil only after the work finished")
	assert.Zero(t, a.Stats().Reserved, "trimmed back to the upstream")
	require.NoError(t, a.CloseContext(context.Background()))
	assert.True(t, a.IsClosed())
}
