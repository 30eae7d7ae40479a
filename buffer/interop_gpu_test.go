package buffer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// CloseAfter orders the free after work a "foreign" library queued on its
// own stream (here a stream wrapped by handle, as one from PyTorch would
// be): the resource frees on the allocation stream, which waited for it.
func TestInteropCloseAfterForeignStream(t *testing.T) {
	d, s, k := gpu(t)
	other := cudatest.Stream(t, d)
	foreign, err := d.WrapStream(other.Handle())
	require.NoError(t, err)
	require.True(t, foreign.IsBorrowed())

	mr := &deviceResource{dev: d}
	const n = 64 << 20
	b, err := buffer.Allocate(mr, n, s)
	require.NoError(t, err)
	// "Foreign" work on the memory, on the other stream, several passes.
	err = buffer.Use("test", func(ptrs []cuda.DevicePtr) error {
		for seed := range uint32(8) {
			if err := k.Write(foreign, ptrs[0], n, seed); err != nil {
				return err
			}
		}
		return nil
	}, b)
	require.NoError(t, err)
	require.NoError(t, b.CloseAfter(foreign))
	assert.True(t, b.IsClosed())
	done, err := other.Done()
	require.NoError(t, err)
	assert.True(t, done, "the free on the allocation stream waited for the foreign stream's work")
	mr.mu.Lock()
	assert.Equal(t, []*cuda.Stream{s}, mr.frees, "freed on the allocation stream")
	mr.mu.Unlock()

	// The borrowed stream's Close ends its use here only: the stream it
	// wraps still works.
	require.NoError(t, foreign.Close())
	assert.ErrorIs(t, foreign.Sync(), cuda.ErrClosed)
	require.NoError(t, other.Sync())
}

// Use over several device buffers hands foreign code their addresses; the
// data a kernel writes through them is what the host reads back.
func TestInteropUseSeveralOnDevice(t *testing.T) {
	d, s, k := gpu(t)
	mr := &deviceResource{dev: d}
	const n = 1 << 20
	a, err := buffer.Allocate(mr, n, s)
	require.NoError(t, err)
	b, err := buffer.Allocate(mr, n, s)
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	require.NoError(t, buffer.Use("test", func(ptrs []cuda.DevicePtr) error {
		if err := k.Write(s, ptrs[0], n, 3); err != nil {
			return err
		}
		return k.Write(s, ptrs[1], n, 4)
	}, a, b))
	requireHost(t, a, s, cudatest.Pattern(n, 3))
	requireHost(t, b, s, cudatest.Pattern(n, 4))
}
