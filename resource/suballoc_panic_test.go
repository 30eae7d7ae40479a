package resource

// CPU tests of user code that panics under a SubAllocator (its segment
// hooks, its upstream): the panic reaches the caller, and the
// sub-allocator stays usable and closable, with its books whole. A
// regression leaves a lock held or a count raised, and the next call
// blocks: every call after a panic runs under within, so that the test
// fails instead of hanging.

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// within runs f on a goroutine of its own and fails the test if f has not
// returned after a while far longer than it needs: a call blocked for
// good by a lock or count that a panic left behind.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s has not returned: a lock or count left behind by a panic?", what)
	}
}

// userPanic is what the panicking user code of these tests panics with.
type userPanic string

// mustPanic runs f and asserts it panicked with want.
func mustPanic(t *testing.T, want userPanic, f func()) {
	t.Helper()
	var got any
	func() {
		defer func() { got = recover() }()
		f()
	}()
	require.Equal(t, want, got, "the panic reaches the caller")
}

// panicking wraps hooks so that Acquired and Released panic while acq and
// rel are set (before the recorder sees the call).
func panicking(h *SegmentHooks, acq, rel *atomic.Bool) *SegmentHooks {
	return &SegmentHooks{
		Acquired: func(p cuda.DevicePtr, n uint64) error {
			if acq.Load() {
				panic(userPanic("Acquired"))
			}
			return h.Acquired(p, n)
		},
		Released: func(p cuda.DevicePtr, n uint64) error {
			if rel.Load() {
				panic(userPanic("Released"))
			}
			return h.Released(p, n)
		},
	}
}

// newPanicSA is newSA without its cleanup, which takes the lock: a test
// that finds the lock held must fail, not hang in its cleanup. The test
// checks the books itself (endPanicSA).
func newPanicSA(t *testing.T, up buffer.MemoryResource, opts *SubAllocatorOptions) *SubAllocator {
	t.Helper()
	a, err := NewSubAllocator(up, opts)
	require.NoError(t, err)
	a.order = &saOrder{}
	return a
}

// endPanicSA closes a, checks its books and that the fake upstream got
// everything back.
func endPanicSA(t *testing.T, a *SubAllocator, up *saUpstream) {
	t.Helper()
	var err error
	within(t, "Close", func() { err = a.Close() })
	require.NoError(t, err)
	within(t, "the books' check", func() { saCheck(t, a) })
	assert.Zero(t, a.Stats())
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Empty(t, up.live, "every block back upstream")
}

// An Acquired that panics while an Allocate grows: the block goes back to
// the upstream, the lock is free, and the next Allocate (the hook fixed)
// grows as usual.
func TestSegmentHooksAcquiredPanics(t *testing.T) {
	rec := newSegRecorder()
	var acq, rel atomic.Bool
	up := newSAUpstream()
	rec.up = up
	a := newPanicSA(t, up, &SubAllocatorOptions{GrowSize: saMiB, Segments: panicking(rec.hooks(), &acq, &rel)})

	acq.Store(true)
	mustPanic(t, "Acquired", func() { _, _, _ = a.AllocatePtr(saKiB, nil) })
	acq.Store(false)
	up.mu.Lock()
	assert.Empty(t, up.live, "the block the hook did not accept went back")
	assert.Len(t, up.allocs, 1)
	up.mu.Unlock()

	var p cuda.DevicePtr
	var err error
	within(t, "Allocate after a panicking Acquired", func() { p, _, err = a.AllocatePtr(saKiB, nil) })
	require.NoError(t, err)
	assert.Equal(t, 1, a.Stats().Blocks)
	require.NoError(t, a.Deallocate(p, saKiB, nil))
	within(t, "Trim", func() { err = a.Trim() })
	require.NoError(t, err)
	endPanicSA(t, a, up)
	rec.check(t)
}

// An Acquired that panics on the initial block: NewSubAllocator panics,
// and the block does not stay with the upstream.
func TestSegmentHooksAcquiredPanicsInitial(t *testing.T) {
	up := newSAUpstream()
	hooks := &SegmentHooks{Acquired: func(cuda.DevicePtr, uint64) error { panic(userPanic("Acquired")) }}
	mustPanic(t, "Acquired", func() {
		_, _ = NewSubAllocator(up, &SubAllocatorOptions{InitialSize: saMiB, Segments: hooks})
	})
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Len(t, up.allocs, 1)
	assert.Empty(t, up.live, "the initial block went back")
}

// A Released that panics inside Trim: every free block stays (the one in
// hand, still acquired, and those after it), nothing is counted as being
// given back, and Close, the hook fixed, releases each block once.
func TestSegmentHooksReleasedPanicsInTrim(t *testing.T) {
	rec := newSegRecorder()
	var acq, rel atomic.Bool
	up := newSAUpstream()
	rec.up = up
	a := newPanicSA(t, up, &SubAllocatorOptions{GrowSize: saMiB, Segments: panicking(rec.hooks(), &acq, &rel)})
	p, _, err := a.AllocatePtr(saKiB, nil)
	require.NoError(t, err)
	q, _, err := a.AllocatePtr(2*saMiB, nil) // a second block, of its own size
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, saKiB, nil))
	require.NoError(t, a.Deallocate(q, 2*saMiB, nil))
	before := a.Stats()
	require.Equal(t, 2, before.Blocks)

	rel.Store(true)
	mustPanic(t, "Released", func() { _ = a.Trim() })
	rel.Store(false)
	var st SubAllocatorStats
	within(t, "Stats after a panicking Released", func() { st = a.Stats() })
	assert.Equal(t, before, st, "both blocks back on the books, whole")
	rec.mu.Lock()
	assert.Len(t, rec.registered, 2, "both still registered")
	rec.mu.Unlock()

	// Still usable: the free blocks serve an allocation without growing.
	within(t, "Allocate", func() { p, _, err = a.AllocatePtr(saKiB, nil) })
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, saKiB, nil))
	assert.Len(t, up.allocs, 2, "no block taken")
	endPanicSA(t, a, up)
	rec.check(t)
}

// A Released that panics inside Close: the sub-allocator is closed, the
// blocks stay, and the next Close gives them back.
func TestSegmentHooksReleasedPanicsInClose(t *testing.T) {
	rec := newSegRecorder()
	var acq, rel atomic.Bool
	up := newSAUpstream()
	rec.up = up
	a := newPanicSA(t, up, &SubAllocatorOptions{GrowSize: saMiB, InitialSize: saMiB, Segments: panicking(rec.hooks(), &acq, &rel)})

	rel.Store(true)
	mustPanic(t, "Released", func() { _ = a.Close() })
	rel.Store(false)
	var err error
	within(t, "Allocate after Close", func() { _, _, err = a.AllocatePtr(saKiB, nil) })
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Equal(t, 1, a.Stats().Blocks, "the block stays until a Close gives it back")
	endPanicSA(t, a, up)
	rec.check(t)
}

// A Released that panics in the Deallocate of the last allocation after
// Close: the range is freed (Deallocate's own work was done), the block
// stays, and the next Close gives it back.
func TestSegmentHooksReleasedPanicsInDeallocate(t *testing.T) {
	rec := newSegRecorder()
	var acq, rel atomic.Bool
	up := newSAUpstream()
	rec.up = up
	a := newPanicSA(t, up, &SubAllocatorOptions{GrowSize: saMiB, Segments: panicking(rec.hooks(), &acq, &rel)})
	p, _, err := a.AllocatePtr(saKiB, nil)
	require.NoError(t, err)
	require.ErrorIs(t, a.Close(), cuda.ErrorIllegalState)

	rel.Store(true)
	mustPanic(t, "Released", func() { _ = a.Deallocate(p, saKiB, nil) })
	rel.Store(false)
	var st SubAllocatorStats
	within(t, "Stats", func() { st = a.Stats() })
	assert.Zero(t, st.Allocations, "the range was freed")
	assert.Equal(t, 1, st.Blocks, "its block stays")
	within(t, "a second Deallocate", func() { err = a.Deallocate(p, saKiB, nil) })
	require.ErrorIs(t, err, cuda.ErrInvalidArgument, "freed already")
	endPanicSA(t, a, up)
	rec.check(t)
}

// The upstream refuses a block's free and Acquired, run again for the
// block that stays, panics: the block stays, owned but no longer
// registered, and Close gives it back without calling Released again.
func TestSegmentHooksReacquirePanics(t *testing.T) {
	rec := newSegRecorder()
	var acq, rel atomic.Bool
	up := newSAUpstream()
	rec.up = up
	a := newPanicSA(t, up, &SubAllocatorOptions{GrowSize: saMiB, InitialSize: saMiB, Segments: panicking(rec.hooks(), &acq, &rel)})
	up.mu.Lock()
	up.freeErr = func(*cuda.Stream) error { return fmt.Errorf("refused: %w", cuda.ErrorUnknown) }
	up.mu.Unlock()

	acq.Store(true)
	mustPanic(t, "Acquired", func() { _ = a.Trim() })
	acq.Store(false)
	up.mu.Lock()
	up.freeErr = nil
	up.mu.Unlock()
	var st SubAllocatorStats
	within(t, "Stats", func() { st = a.Stats() })
	assert.Equal(t, 1, st.Blocks)
	endPanicSA(t, a, up)
	rec.check(t) // one acquire, one release: not released twice
}

// panickyUpstream is a fake upstream whose AllocatePtr and Deallocate
// panic while the flags are set.
type panickyUpstream struct {
	*saUpstream
	alloc, free atomic.Bool
}

func (u *panickyUpstream) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if u.alloc.Load() {
		panic(userPanic("AllocatePtr"))
	}
	return u.saUpstream.AllocatePtr(size, s)
}

func (u *panickyUpstream) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if u.free.Load() {
		panic(userPanic("Deallocate"))
	}
	return u.saUpstream.Deallocate(p, size, s)
}

// An upstream that panics while the sub-allocator grows (under its lock):
// the lock is free again, and the next Allocate grows.
func TestSubAllocatorUpstreamPanics(t *testing.T) {
	up := &panickyUpstream{saUpstream: newSAUpstream()}
	a := newPanicSA(t, up, &SubAllocatorOptions{GrowSize: saMiB})
	up.alloc.Store(true)
	mustPanic(t, "AllocatePtr", func() { _, _, _ = a.AllocatePtr(saKiB, nil) })
	up.alloc.Store(false)
	var p cuda.DevicePtr
	var err error
	within(t, "Allocate after a panicking upstream", func() { p, _, err = a.AllocatePtr(saKiB, nil) })
	require.NoError(t, err)
	require.NoError(t, a.Deallocate(p, saKiB, nil))
	endPanicSA(t, a, up.saUpstream)
}
