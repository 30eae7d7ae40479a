package buffer_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

func TestPtrErr(t *testing.T) {
	mr := newFake()
	b, err := buffer.Allocate(mr, 256, nil)
	require.NoError(t, err)
	p, err := b.PtrErr()
	require.NoError(t, err)
	assert.Equal(t, b.Ptr(), p)
	v, err := b.Slice(16, 32)
	require.NoError(t, err)
	vp, err := v.PtrErr()
	require.NoError(t, err)
	assert.Equal(t, p+16, vp)

	require.NoError(t, b.Close())
	assert.Zero(t, b.Ptr(), "Ptr stays 0 once closed")
	_, err = b.PtrErr()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "Buffer.PtrErr")
	_, err = v.PtrErr()
	assert.ErrorIs(t, err, cuda.ErrClosed, "a view of a closed owner")

	_, err = (*buffer.Buffer)(nil).PtrErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = (&buffer.Buffer{}).PtrErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = buffer.FromPointer(0, 16).PtrErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	p, err = buffer.FromPointer(0, 0).PtrErr()
	assert.NoError(t, err, "an empty buffer at 0 is fine")
	assert.Zero(t, p)
}

func TestUseSeveral(t *testing.T) {
	mr := newFake()
	a, _ := buffer.Allocate(mr, 64, nil)
	b, _ := buffer.Allocate(mr, 64, nil)
	var got []cuda.DevicePtr
	require.NoError(t, buffer.Use("test", func(ptrs []cuda.DevicePtr) error {
		got = append(got, ptrs...)
		return nil
	}, a, b, a))
	assert.Equal(t, []cuda.DevicePtr{a.Ptr(), b.Ptr(), a.Ptr()}, got, "in order, duplicates allowed")

	mine := errors.New("mine")
	assert.Same(t, mine, buffer.Use("test", func([]cuda.DevicePtr) error { return mine }, a, b))
	require.NoError(t, buffer.Use("test", func(ptrs []cuda.DevicePtr) error {
		assert.Empty(t, ptrs)
		return nil
	}))

	assert.ErrorIs(t, buffer.Use("test", nil, a), cuda.ErrInvalidArgument)
	err := buffer.Use("test", func([]cuda.DevicePtr) error { t.Error("ran"); return nil }, a, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "buffer 1 of 2")

	require.NoError(t, b.Close())
	err = buffer.Use("test", func([]cuda.DevicePtr) error { t.Error("ran with a closed buffer"); return nil }, a, b)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "buffer 1 of 2")
	// a was let go: its Close does not wait.
	done := make(chan error)
	go func() { done <- a.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close of a buffer a failed Use had taken never returned: Use kept it")
	}
}

// A Use that starts while a Close of one of its buffers waits fails at once
// with ErrClosed and holds nothing, so the Close of another of its buffers
// is not kept waiting.
func TestUseSeveralDuringClose(t *testing.T) {
	mr := newFake()
	a, _ := buffer.Allocate(mr, 64, nil)
	b, _ := buffer.Allocate(mr, 64, nil)
	inside, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = b.Use("hold", func(cuda.DevicePtr) error { close(inside); <-release; return nil })
	}()
	<-inside
	closed := make(chan error)
	go func() { closed <- b.Close() }()
	// Wait until that Close waits for the lock: new calls on b then fail.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := b.Use("probe", func(cuda.DevicePtr) error { return nil })
		if errors.Is(err, cuda.ErrClosed) {
			break
		}
		require.True(t, time.Now().Before(deadline), "Close never started waiting")
		time.Sleep(time.Millisecond)
	}
	err := buffer.Use("test", func([]cuda.DevicePtr) error { t.Error("ran"); return nil }, a, b)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	require.NoError(t, a.Close(), "a was not kept")
	close(release)
	require.NoError(t, <-closed)
}

// Use over several buffers against Closes of the same buffers, in every
// order, from many goroutines: nothing deadlocks, every call either runs
// with all its buffers open or fails with ErrClosed, and every buffer is
// freed once.
func TestUseSeveralConcurrentCloseNoDeadlock(t *testing.T) {
	for round := range 50 {
		mr := newFake()
		bufs := make([]*buffer.Buffer, 4)
		for i := range bufs {
			bufs[i], _ = buffer.Allocate(mr, 64, nil)
		}
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				order := []*buffer.Buffer{bufs[g%4], bufs[(g+1)%4], bufs[(g+3)%4]}
				if g%2 == 1 {
					order[0], order[2] = order[2], order[0]
				}
				for range 20 {
					err := buffer.Use("test", func(ptrs []cuda.DevicePtr) error {
						for _, b := range order {
							if b.IsClosed() {
								t.Error("a buffer closed under Use")
							}
						}
						// Nested: another multi-buffer Use inside.
						_ = buffer.Use("nested", func([]cuda.DevicePtr) error { return nil }, order[2], order[1])
						return nil
					}, order...)
					if err != nil && !errors.Is(err, cuda.ErrClosed) {
						t.Errorf("Use: %v", err)
					}
				}
			}()
		}
		for i := range bufs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, bufs[(i+round)%4].Close())
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("deadlock: Use and Close did not finish")
		}
		mr.mu.Lock()
		assert.Empty(t, mr.live, "every buffer freed")
		assert.Len(t, mr.freed, 4, "each once")
		mr.mu.Unlock()
	}
}

func TestCloseAfterWithoutStreamsIsClose(t *testing.T) {
	mr := newFake()
	b, _ := buffer.Allocate(mr, 64, nil)
	require.NoError(t, b.CloseAfter())
	assert.True(t, b.IsClosed())
	require.NoError(t, b.CloseAfter(), "idempotent")
	c, _ := buffer.Allocate(mr, 64, nil)
	require.NoError(t, c.CloseAfter(nil, nil), "nil streams stand for the buffer's own")
	assert.True(t, c.IsClosed())

	d, _ := buffer.Allocate(mr, 64, nil)
	err := d.CloseAfter(nil, &cuda.Stream{})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "stream 1 of 2")
	assert.False(t, d.IsClosed(), "left open")
	require.NoError(t, d.Close())

	assert.NoError(t, (*buffer.Buffer)(nil).CloseAfter())
	assert.NoError(t, (&buffer.Buffer{}).CloseAfter())
	borrowed := buffer.FromPointer(0x1000, 16)
	require.NoError(t, borrowed.CloseAfter(), "borrowed: only closes")
	assert.True(t, borrowed.IsClosed())
}
