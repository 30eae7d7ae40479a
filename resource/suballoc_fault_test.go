package resource

// CPU regression tests for the SubAllocator's failure paths in Trim and
// Close (issue 6: "every multi-step operation completes or leaves the
// object exactly as it was"; failures are reported, never swallowed),
// over the fake upstream and orderer of suballoc_test.go. The driver fault
// sweep (internal/suites/faultsweep) checks the same against the fake driver.

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// saOOM is what a failing fake upstream free returns: a driver failure,
// not a destroyed stream.
func saOOM(what string) error {
	return &cuda.OpError{Op: "fake.Deallocate", Err: fmt.Errorf("%s: %w", what, cuda.ErrorOutOfMemory)}
}

// saFreeBlocks makes n blocks of one MiB, each allocated whole on its
// stream and freed there, so that each is one free range.
func saFreeBlocks(t *testing.T, a *SubAllocator, streams ...*cuda.Stream) {
	t.Helper()
	var bs []*buffer.Buffer
	for _, s := range streams {
		b, err := a.Allocate(saMiB, s)
		require.NoError(t, err)
		bs = append(bs, b)
	}
	for _, b := range bs {
		require.NoError(t, b.Close())
	}
}

// An upstream free that fails on the freeing stream is reported: it used
// to be retried on the default stream and, when that worked, dropped.
func TestSubAllocatorTrimReportsUpstreamFailure(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s := new(cuda.Stream)
	saFreeBlocks(t, a, s)
	before := a.Stats()

	up.freeErr = func(st *cuda.Stream) error {
		if st != nil {
			return saOOM("free on the stream")
		}
		return nil // a fallback to the default stream would succeed
	}
	err := a.Trim()
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "SubAllocator.Trim: give back ")
	assert.Contains(t, err.Error(), "free on the stream")
	var te *TrimError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, TrimError{Bytes: 0, Blocks: 0, Kept: 1}, TrimError{Bytes: te.Bytes, Blocks: te.Blocks, Kept: te.Kept})
	assert.Equal(t, before, a.Stats(), "the block stays")
	_, frees, live := up.counts()
	assert.Equal(t, [2]int{0, 1}, [2]int{frees, live})
	saCheck(t, a)

	// The block is still the sub-allocator's and serves allocations.
	allocs, _, _ := up.counts()
	b, err := a.Allocate(saMiB, s)
	require.NoError(t, err)
	n, _, _ := up.counts()
	assert.Equal(t, allocs, n, "served from the kept block")
	require.NoError(t, b.Close())

	up.freeErr = nil
	require.NoError(t, a.Trim())
	assert.Zero(t, a.Stats())
	require.NoError(t, a.Close())
}

// Close reports a failed upstream free too; the block stays, and the next
// Close gives it back.
func TestSubAllocatorCloseReportsUpstreamFailure(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s := new(cuda.Stream)
	saFreeBlocks(t, a, s)
	up.freeErr = func(st *cuda.Stream) error {
		if st != nil {
			return saOOM("free on the stream")
		}
		return nil
	}
	err := a.Close()
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "SubAllocator.Close: give back ")
	assert.True(t, a.IsClosed())
	assert.Equal(t, 1, a.Stats().Blocks)
	_, _, live := up.counts()
	assert.Equal(t, 1, live)

	up.freeErr = nil
	require.NoError(t, a.Close(), "retried")
	_, _, live = up.counts()
	assert.Zero(t, live)
	assert.Zero(t, a.Stats())
}

// Trim waits for every stream before it gives anything back: a wait that
// fails changes nothing. It used to give back the blocks whose streams
// were waited for before the failing one.
func TestSubAllocatorTrimWaitsBeforeGivingBack(t *testing.T) {
	a, up, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s1, s2 := new(cuda.Stream), new(cuda.Stream)
	saFreeBlocks(t, a, s1, s2)
	before := a.Stats()
	require.Equal(t, 2, before.Blocks)

	o.syncFail = func(s *cuda.Stream) error {
		if s == s2 {
			return saOOM("sync s2")
		}
		return nil
	}
	err := a.Trim()
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "give back 2 blocks (2097152 bytes) to fake: wait for stream")
	var te *TrimError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, [3]uint64{0, 0, 2}, [3]uint64{te.Bytes, uint64(te.Blocks), uint64(te.Kept)})
	assert.Equal(t, before, a.Stats(), "nothing given back")
	_, frees, _ := up.counts()
	assert.Zero(t, frees)
	saCheck(t, a)

	// Each block is still free on its own stream: no ordering needed.
	o.reset()
	b, err := a.Allocate(saMiB, s2)
	require.NoError(t, err)
	assert.Empty(t, o.waits)
	require.NoError(t, b.Close())

	o.syncFail = nil
	require.NoError(t, a.Trim())
	assert.Zero(t, a.Stats())
	require.NoError(t, a.Close())
}

// A block whose free fails stays; the others are given back, and the
// TrimError says exactly how much went.
func TestSubAllocatorTrimPartial(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s := new(cuda.Stream)
	saFreeBlocks(t, a, s, s)
	calls := 0
	up.freeErr = func(*cuda.Stream) error {
		calls++
		if calls == 1 {
			return saOOM("first free")
		}
		return nil
	}
	err := a.Trim()
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	var te *TrimError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, [3]uint64{saMiB, 1, 1}, [3]uint64{te.Bytes, uint64(te.Blocks), uint64(te.Kept)})
	assert.Contains(t, err.Error(), "first free")
	assert.Contains(t, err.Error(), "(gave back 1 of 2 free blocks, 1048576 bytes)")
	assert.Equal(t, SubAllocatorStats{Reserved: saMiB, Free: saMiB, Blocks: 1, FreeRanges: 1}, a.Stats())
	_, frees, live := up.counts()
	assert.Equal(t, [2]int{1, 1}, [2]int{frees, live})
	saCheck(t, a)

	up.freeErr = nil
	require.NoError(t, a.Trim())
	_, _, live = up.counts()
	assert.Zero(t, live)
	require.NoError(t, a.Close())
}

// An upstream whose free reports buffer.ErrPartlyFreed has freed the
// memory: the block must be gone (it used to go back on the free lists,
// over memory the upstream no longer held), and the error is reported.
func TestSubAllocatorTrimPartlyFreed(t *testing.T) {
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s := new(cuda.Stream)
	saFreeBlocks(t, a, s)
	up.freeErr = func(*cuda.Stream) error {
		return fmt.Errorf("tidy up: %w", buffer.ErrPartlyFreed)
	}
	err := a.Trim()
	require.ErrorIs(t, err, buffer.ErrPartlyFreed)
	var te *TrimError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, [3]uint64{saMiB, 1, 0}, [3]uint64{te.Bytes, uint64(te.Blocks), uint64(te.Kept)})
	assert.Zero(t, a.Stats(), "the block is gone")
	_, _, live := up.counts()
	assert.Zero(t, live)
	up.freeErr = nil
	require.NoError(t, a.Close())
}

// A failed event destruction in Close is retried by the next Close, not
// forgotten (with the real orderer the event used to leak).
func TestSubAllocatorCloseRetriesOrderer(t *testing.T) {
	a, _, o := newSA(t, nil)
	o.closeErrs = []error{saOOM("cuEventDestroy")}
	err := a.Close()
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "SubAllocator.Close: ")
	assert.Contains(t, err.Error(), "cuEventDestroy")
	assert.True(t, a.IsClosed())
	require.NoError(t, a.Close())
	assert.Equal(t, 2, o.closes, "retried")
	require.NoError(t, a.Close())
	assert.Equal(t, 2, o.closes, "done once it succeeded")
}

// A stream whose event Trim fails to drop is kept, so that the next Trim
// retries; it used to be dropped with its event still held.
func TestSubAllocatorTrimRetriesForget(t *testing.T) {
	a, _, o := newSA(t, &SubAllocatorOptions{GrowSize: saMiB})
	s := new(cuda.Stream)
	b, err := a.Allocate(saMiB, s) // takes the whole block: s's list is empty
	require.NoError(t, err)
	o.forgetErrs = []error{errors.New("event destroy broke")}
	err = a.Trim()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SubAllocator.Trim: forget stream ")
	assert.Contains(t, err.Error(), "event destroy broke")
	require.NoError(t, a.Trim())
	assert.Equal(t, []*cuda.Stream{s, s}, o.forgets, "retried")
	require.NoError(t, a.Trim())
	assert.Len(t, o.forgets, 2, "forgotten once it worked")
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
}
