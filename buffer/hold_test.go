package buffer_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

func TestHoldDefersCloseUntilRelease(t *testing.T) {
	m := newFake()
	b := m.alloc(256)
	p := b.Ptr()
	h, err := b.Hold("test")
	require.NoError(t, err)
	assert.Equal(t, p, h.Ptr())
	assert.Equal(t, uint64(256), h.Size())
	assert.Equal(t, 1, b.Holds())

	require.NoError(t, b.Close(), "Close of a held buffer succeeds")
	assert.True(t, b.IsClosed(), "closed for Go at once")
	_, err = b.PtrErr()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.False(t, m.wasFreed(p), "the memory outlives Close while held")
	assert.Equal(t, 1, m.liveCount())
	require.NoError(t, b.Close(), "Close stays idempotent")

	require.NoError(t, h.Release())
	assert.True(t, m.wasFreed(p), "the last Release frees")
	assert.Equal(t, 0, m.liveCount())
	require.NoError(t, h.Release(), "Release is idempotent")
	assert.Len(t, m.freed, 1, "freed exactly once")
}

// A held buffer closed on a zero cuda.Stream: the free would be left to
// the last Release, where every resource refuses a stream no device made,
// so the memory could never be freed. The Close is refused instead, and the
// buffer stays open and held, to be closed on a real stream (or nil).
func TestHoldRefusesCloseOnZeroStream(t *testing.T) {
	m := newFake()
	b := m.alloc(128)
	p := b.Ptr()
	h, err := b.Hold("test")
	require.NoError(t, err)
	err = b.CloseOn(new(cuda.Stream))
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "Buffer.CloseOn")
	assert.Contains(t, err.Error(), "zero cuda.Stream")
	assert.False(t, b.IsClosed(), "still open")
	assert.Equal(t, 1, b.Holds())

	require.NoError(t, b.CloseOn(nil))
	assert.True(t, b.IsClosed())
	assert.False(t, m.wasFreed(p), "left to the Release")
	require.NoError(t, h.Release())
	assert.True(t, m.wasFreed(p))
	assert.Zero(t, m.liveCount())
}

func TestHoldReleasedBeforeClose(t *testing.T) {
	m := newFake()
	b := m.alloc(64)
	h, err := b.Hold("test")
	require.NoError(t, err)
	require.NoError(t, h.Release())
	assert.Equal(t, 0, b.Holds())
	assert.Equal(t, 1, m.liveCount(), "a release of an open buffer frees nothing")
	require.NoError(t, b.Close())
	assert.Equal(t, 0, m.liveCount(), "Close frees as usual once the holds are gone")
	require.NoError(t, h.Release())
	assert.Len(t, m.freed, 1)
}

func TestHoldManyAndViews(t *testing.T) {
	m := newFake()
	b := m.alloc(1024)
	v, err := b.Slice(512, 256)
	require.NoError(t, err)
	h1, err := b.Hold("test")
	require.NoError(t, err)
	h2, err := v.Hold("test")
	require.NoError(t, err)
	assert.Equal(t, b.Ptr()+512, h2.Ptr(), "a view's hold covers the view")
	assert.Equal(t, 2, b.Holds(), "owner and views share the count")
	assert.Equal(t, 2, v.Holds())

	require.NoError(t, v.Close(), "a view's Close frees nothing anyway")
	require.NoError(t, b.Close())
	require.NoError(t, h2.Release())
	assert.Equal(t, 1, m.liveCount(), "one hold left")
	require.NoError(t, h1.Release())
	assert.Equal(t, 0, m.liveCount())
}

func TestHoldRefusals(t *testing.T) {
	var nilBuf *buffer.Buffer
	_, err := nilBuf.Hold("op")
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = new(buffer.Buffer).Hold("op")
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = buffer.FromPointer(0, 16).Hold("op")
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a range no memory has")

	m := newFake()
	b := m.alloc(16)
	require.NoError(t, b.Close())
	_, err = b.Hold("dlpack.Export")
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.ErrorContains(t, err, "dlpack.Export")

	var h *buffer.Hold
	assert.NoError(t, h.Release())
	assert.Zero(t, h.Ptr())
	assert.Zero(t, h.Size())
	assert.Zero(t, nilBuf.Holds())
}

func TestHoldBlocksDisown(t *testing.T) {
	m := newFake()
	b := m.alloc(32)
	h, err := b.Hold("test")
	require.NoError(t, err)
	_, _, err = b.Disown()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorContains(t, err, "held by 1")
	assert.False(t, b.IsClosed(), "a refused Disown leaves the buffer open")
	require.NoError(t, h.Release())
	p, n, err := b.Disown()
	require.NoError(t, err)
	assert.Equal(t, uint64(32), n)
	require.NoError(t, m.Deallocate(p, n, nil))
}

func TestHoldBorrowed(t *testing.T) {
	b := buffer.FromPointer(0x1000, 8)
	h, err := b.Hold("test")
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, h.Release(), "nothing to free for borrowed memory")
}

func TestHoldDeferredFreeFails(t *testing.T) {
	m := newFake()
	b := m.alloc(128)
	h, err := b.Hold("test")
	require.NoError(t, err)
	require.NoError(t, b.Close())
	m.failFrees = 1
	err = h.Release()
	assert.ErrorIs(t, err, errFakeFree, "the deferred free's error comes back from Release")
	assert.ErrorContains(t, err, "last Hold's Release")
	assert.Equal(t, 1, m.liveCount(), "the memory stays allocated")
	require.NoError(t, h.Release(), "a second Release does not free again")
	for ptr, size := range m.live {
		require.NoError(t, m.Deallocate(ptr, size, nil))
	}
}

// TestHoldReleaseInsideUse releases a hold from inside Use on the same
// buffer: Release never takes the lock, so this cannot deadlock.
func TestHoldReleaseInsideUse(t *testing.T) {
	m := newFake()
	b := m.alloc(16)
	h, err := b.Hold("test")
	require.NoError(t, err)
	require.NoError(t, b.Use("test", func(cuda.DevicePtr) error { return h.Release() }))
	require.NoError(t, b.Close())
	assert.Equal(t, 0, m.liveCount())
}

// TestHoldRacesClose races holds and releases against Close: the memory
// is freed exactly once, after Close and every successful hold's release.
func TestHoldRacesClose(t *testing.T) {
	for range 200 {
		m := newFake()
		b := m.alloc(64)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					h, err := b.Hold("race")
					if err != nil {
						if !errors.Is(err, cuda.ErrClosed) {
							t.Errorf("Hold: %v", err)
						}
						return
					}
					if m.liveCount() != 1 {
						t.Errorf("memory freed under a live hold")
					}
					if err := h.Release(); err != nil {
						t.Errorf("Release: %v", err)
					}
				}
			}()
		}
		require.NoError(t, b.Close())
		wg.Wait()
		assert.Equal(t, 0, m.liveCount())
		assert.Len(t, m.freed, 1)
	}
}
