package resource_test

// CPU tests of the out-of-memory adaptors (Retrying, Fallback) and of
// Tracking's OnOutOfMemory hook, over fake upstreams that fail with
// cuda.ErrorOutOfMemory on demand.

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

func TestRetryingRetriesWhileAsked(t *testing.T) {
	up := newRecording()
	up.fail(2, 0)
	var calls []int
	r := resource.NewRetrying(up, func(size uint64, attempt int) bool {
		assert.Equal(t, uint64(4096), size)
		calls = append(calls, attempt)
		return true
	})
	buf, err := r.Allocate(4096, nil)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, calls)
	assert.Equal(t, uint64(2), r.Retries())
	require.NoError(t, buf.Close())
	up.requireEmpty(t)
}

func TestRetryingGivesUp(t *testing.T) {
	up := newRecording()
	up.fail(5, 0)
	calls := 0
	r := resource.NewRetrying(up, func(_ uint64, attempt int) bool {
		calls++
		return attempt < 2 // one retry
	})
	_, err := r.Allocate(4096, nil)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrorOutOfMemory), "%v", err)
	assert.Equal(t, 2, calls, "asked after each failure")
	_, _, _, allocs, _ := up.counts()
	assert.Zero(t, allocs)
	up.mu.Lock()
	assert.Equal(t, 3, up.failAllocs, "two attempts reached the upstream")
	up.mu.Unlock()
}

// Errors other than out-of-memory are not retried.
func TestRetryingOtherErrors(t *testing.T) {
	// A Tracking with no upstream fails every Allocate with an invalid
	// argument: not something a retry fixes.
	r := resource.NewRetrying(resource.NewTracking(nil, nil), func(uint64, int) bool {
		t.Error("asked to retry")
		return true
	})
	_, err := r.Allocate(1, nil)
	assert.True(t, errors.Is(err, cuda.ErrInvalidArgument), "%v", err)
	assert.Zero(t, r.Retries())
	r = resource.NewRetrying(nil, func(uint64, int) bool { t.Error("asked"); return false })
	_, err = r.Allocate(1, nil)
	assert.True(t, errors.Is(err, cuda.ErrInvalidArgument), "%v", err)
}

func TestFallbackRoutesDeallocate(t *testing.T) {
	primary, alt := newRecording(), newRecording()
	alt.next = 0x1000_0000_0000 // tell the two apart
	f := resource.NewFallback(primary, alt)

	a, err := f.Allocate(1000, nil)
	require.NoError(t, err)
	primary.fail(1, 0)
	b, err := f.Allocate(2000, nil) // primary out of memory: from alt
	require.NoError(t, err)
	c, err := f.Allocate(3000, nil)
	require.NoError(t, err)

	assert.Equal(t, uint64(1), f.Fallbacks())
	assert.Equal(t, 1, f.LiveFallbacks())
	live, bytes, _, _, _ := alt.counts()
	assert.Equal(t, 1, live)
	assert.Equal(t, uint64(2000), bytes)
	assert.Equal(t, cuda.DevicePtr(0x1000_0000_0000), b.Ptr())

	require.NoError(t, b.Close())
	alt.requireEmpty(t)
	_, _, _, _, pfrees := primary.counts()
	assert.Zero(t, pfrees, "the fallback's buffer went to the fallback")
	require.NoError(t, a.Close())
	require.NoError(t, c.Close())
	primary.requireEmpty(t)
	assert.Zero(t, f.LiveFallbacks())
}

// A failed free of a fallback allocation keeps the address with the
// fallback, so that the retried free goes there again.
func TestFallbackFailedFreeRetries(t *testing.T) {
	primary, alt := newRecording(), newRecording()
	alt.next = 0x1000_0000_0000
	f := resource.NewFallback(primary, alt)
	primary.fail(1, 0)
	b, err := f.Allocate(100, nil)
	require.NoError(t, err)
	alt.fail(0, 1)
	require.Error(t, b.Close())
	assert.Equal(t, 1, f.LiveFallbacks())
	require.NoError(t, b.Close())
	alt.requireEmpty(t)
	primary.requireEmpty(t)
}

func TestFallbackBothFail(t *testing.T) {
	primary, alt := newRecording(), newRecording()
	primary.fail(1, 0)
	alt.fail(1, 0)
	f := resource.NewFallback(primary, alt)
	_, err := f.Allocate(100, nil)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrorOutOfMemory), "%v", err)
	assert.Contains(t, err.Error(), "100 bytes")
	assert.Contains(t, err.Error(), "primary")
	assert.Contains(t, err.Error(), "fallback")
}

func TestFallbackAccessibility(t *testing.T) {
	primary, alt := newRecording(), newRecording()
	alt.hostAcc = true
	primary.hostAcc = false
	f := resource.NewFallback(primary, alt)
	assert.True(t, f.DeviceAccessible())
	assert.False(t, f.HostAccessible(), "only the fallback's memory is host accessible")
	assert.Equal(t, 7, f.DeviceID())
	assert.Same(t, alt, f.Secondary().(*recordingResource))
}

// The nil receivers answer rather than panic.
func TestOOMAdaptorsNil(t *testing.T) {
	var r *resource.Retrying
	var f *resource.Fallback
	for _, mr := range []buffer.MemoryResource{r, f, &resource.Retrying{}, &resource.Fallback{}} {
		_, _, err := mr.AllocatePtr(1, nil)
		assert.True(t, errors.Is(err, cuda.ErrInvalidArgument), "%T: %v", mr, err)
		assert.True(t, errors.Is(mr.Deallocate(1, 1, nil), cuda.ErrInvalidArgument))
		assert.NoError(t, mr.Deallocate(0, 1, nil))
		assert.False(t, mr.DeviceAccessible())
		assert.False(t, mr.HostAccessible())
		assert.Equal(t, -1, mr.DeviceID())
	}
	assert.Zero(t, r.Retries())
	assert.Zero(t, f.Fallbacks())
	assert.Zero(t, f.LiveFallbacks())
	assert.Equal(t, "Retrying(nil)", r.String())
	assert.Equal(t, "Fallback(nil)", f.String())
}

// Tracking's hook runs on out-of-memory only, with the Tracking, the size
// and the error, and sees the allocations live at that moment.
func TestTrackingOnOutOfMemory(t *testing.T) {
	up := newRecording()
	var got []uint64
	var live []int
	tr := resource.NewTracking(resource.NewLimiting(up, 10000), &resource.TrackingOptions{
		OnOutOfMemory: func(t2 *resource.Tracking, size uint64, err error) {
			got = append(got, size)
			live = append(live, t2.LiveCount())
			assert.True(t, errors.Is(err, cuda.ErrorOutOfMemory))
		},
	})
	a, err := tr.Allocate(6000, nil)
	require.NoError(t, err)
	_, err = tr.Allocate(6000, nil)
	require.Error(t, err)
	_, err = tr.Allocate(1<<63, nil) // also out of memory, past the limit
	require.Error(t, err)
	assert.Equal(t, []uint64{6000, 1 << 63}, got)
	assert.Equal(t, []int{1, 1}, live)
	require.NoError(t, a.Close())
	up.requireEmpty(t)
}

// Sites counts every allocation, freed ones included.
func TestTrackingSites(t *testing.T) {
	tr := resource.NewTracking(newRecording(), nil)
	assert.Nil(t, tr.Sites())
	for range 3 {
		b, err := tr.Allocate(100, nil)
		require.NoError(t, err)
		require.NoError(t, b.Close())
	}
	sites := tr.Sites()
	require.Len(t, sites, 1)
	assert.Nil(t, sites[0].Callers)
	assert.Equal(t, uint64(3), sites[0].Count)
	assert.Equal(t, uint64(300), sites[0].Bytes)
	var nilT *resource.Tracking
	assert.Nil(t, nilT.Sites())
}
