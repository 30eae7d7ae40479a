package cuda_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// longWork queues about n fills of 1 GiB on s (tens of milliseconds on an
// H200), so a wait on it outlasts a short deadline.
func longWork(t *testing.T, d *cuda.Device, s *cuda.Stream, n int) {
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

func TestStreamSyncContextCancelled(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	longWork(t, d, s, 400)
	goroutines := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	err := s.SyncContext(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "Stream.SyncContext")
	done, err := s.Done()
	require.NoError(t, err)
	assert.False(t, done, "the wait returned before the work finished")
	// Many more cancelled waits share the stream's one waiter goroutine.
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Microsecond)
		assert.ErrorIs(t, s.SyncContext(ctx), context.DeadlineExceeded)
		cancel()
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), goroutines+1, "one waiter for the stream, not one per wait")

	require.NoError(t, s.SyncContext(context.Background()))
	done, err = s.Done()
	require.NoError(t, err)
	assert.True(t, done, "SyncContext returned nil only after the work finished")
	for i := 0; i < 1000 && runtime.NumGoroutine() > goroutines; i++ {
		time.Sleep(time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), goroutines, "the waiter ends with the work")
}

func TestEventSyncContext(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer e.Close()
	longWork(t, d, s, 400)
	require.NoError(t, e.Record(s))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Millisecond, cancel)
	err = e.SyncContext(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	done, err := e.Done()
	require.NoError(t, err)
	assert.False(t, done)
	require.NoError(t, e.SyncContext(context.Background()))
	done, err = e.Done()
	require.NoError(t, err)
	assert.True(t, done)
}

func TestDeviceSyncContext(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	longWork(t, d, s, 400)
	// Many waiters, half of them cancelled early: the cancelled ones
	// return at once, the others only after the work is done, and the
	// shared waiter goroutine is gone afterwards.
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make([]error, 32)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i%2 == 1 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Millisecond)
				defer cancel()
			}
			errs[i] = d.SyncContext(ctx)
		}()
	}
	wg.Wait()
	done, err := s.Done()
	require.NoError(t, err)
	assert.True(t, done, "uncancelled Device.SyncContext waits for every stream")
	for i, err := range errs {
		if i%2 == 0 {
			assert.NoError(t, err, "waiter %d", i)
		} else if err != nil {
			assert.ErrorIs(t, err, context.DeadlineExceeded, "waiter %d", i)
		}
	}
	// (Not assert.Eventually: it runs its condition on a goroutine.)
	for i := 0; i < 5000 && runtime.NumGoroutine() > before; i++ {
		time.Sleep(time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "the device's waiter goroutine ends with the work")
	var n int
	for i := 1; i < len(errs); i += 2 {
		if errors.Is(errs[i], context.DeadlineExceeded) {
			n++
		}
	}
	assert.Positive(t, n, "some 1 ms waits on tens of ms of work were cut short")
}

// BenchmarkWaitLatency compares the waits on the same work: a 256 MiB fill
// (about 60 µs on an H200) followed by the wait. The difference between
// the blocking and the context form is what a context-aware wait costs.
func BenchmarkWaitLatency(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	const size = 256 << 20
	p, err := d.MemAlloc(size)
	require.NoError(b, err)
	defer d.MemFree(p)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	require.NoError(b, err)
	defer e.Close()
	ctx := context.Background()
	for _, w := range []struct {
		name string
		wait func() error
	}{
		{"Stream.Sync", s.Sync},
		{"Stream.SyncContext", func() error { return s.SyncContext(ctx) }},
		{"Event.Sync", func() error { return errors.Join(e.Record(s), e.Sync()) }},
		{"Event.SyncContext", func() error { return errors.Join(e.Record(s), e.SyncContext(ctx)) }},
		{"Device.Sync", d.Sync},
		{"Device.SyncContext", func() error { return d.SyncContext(ctx) }},
	} {
		b.Run(w.name, func(b *testing.B) {
			for b.Loop() {
				if err := s.MemsetD32Async(p, 1, size/4); err != nil {
					b.Fatal(err)
				}
				if err := w.wait(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
