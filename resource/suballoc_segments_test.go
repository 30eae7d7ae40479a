package resource

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// segRecorder is a counting SegmentHooks: what is registered now, how
// often each block was registered and released, and whether each release
// came while the upstream still held the block.
type segRecorder struct {
	mu         sync.Mutex
	up         *saUpstream
	registered map[cuda.DevicePtr]uint64
	acquires   map[cuda.DevicePtr]int
	releases   map[cuda.DevicePtr]int
	failAcq    error
	failRel    error
	problems   []string
}

func newSegRecorder() *segRecorder {
	return &segRecorder{registered: map[cuda.DevicePtr]uint64{}, acquires: map[cuda.DevicePtr]int{}, releases: map[cuda.DevicePtr]int{}}
}

func (r *segRecorder) hooks() *SegmentHooks {
	return &SegmentHooks{
		Acquired: func(p cuda.DevicePtr, n uint64) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.failAcq != nil {
				return r.failAcq
			}
			if _, dup := r.registered[p]; dup {
				r.problems = append(r.problems, fmt.Sprintf("%#x registered twice", p))
			}
			if r.up != nil { // nil while NewSubAllocator takes the initial block
				r.up.mu.Lock()
				if r.up.live[p] != n {
					r.problems = append(r.problems, fmt.Sprintf("%#x (%d bytes) acquired but the upstream holds %d there", p, n, r.up.live[p]))
				}
				r.up.mu.Unlock()
			}
			r.registered[p] = n
			r.acquires[p]++
			return nil
		},
		Released: func(p cuda.DevicePtr, n uint64) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.failRel != nil {
				return r.failRel
			}
			if r.registered[p] != n {
				r.problems = append(r.problems, fmt.Sprintf("%#x (%d bytes) released but not registered", p, n))
			}
			r.up.mu.Lock()
			if r.up.live[p] != n {
				r.problems = append(r.problems, fmt.Sprintf("%#x released after the upstream got it back", p))
			}
			r.up.mu.Unlock()
			delete(r.registered, p)
			r.releases[p]++
			return nil
		},
	}
}

// check asserts nothing is registered, every block was released exactly
// once per acquire, and no hook saw a problem.
func (r *segRecorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Empty(t, r.problems)
	assert.Empty(t, r.registered, "everything registered was released")
	assert.Equal(t, r.acquires, r.releases, "each block released exactly as often as acquired")
	assert.NotEmpty(t, r.acquires, "the hooks ran")
}

// Every block is acquired when taken and released exactly once before it
// goes back: by Trim, by Close, and, for a block with live allocations at
// Close, by the last Deallocate.
func TestSegmentHooks(t *testing.T) {
	rec := newSegRecorder()
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, InitialSize: saMiB, Segments: rec.hooks()})
	rec.up = up
	assert.Len(t, rec.acquires, 1, "the initial block")

	b1, err := a.Allocate(saMiB, nil) // fills the initial block
	require.NoError(t, err)
	b2, err := a.Allocate(2*saMiB, nil) // a block of its own size
	require.NoError(t, err)
	b3, err := a.Allocate(saKiB, nil) // a third block, of GrowSize
	require.NoError(t, err)
	assert.Len(t, rec.acquires, 3)
	require.NoError(t, b2.Close())
	require.NoError(t, b3.Close())
	require.NoError(t, a.Trim())
	rec.mu.Lock()
	released := len(rec.releases)
	rec.mu.Unlock()
	assert.Equal(t, 2, released, "Trim released the free blocks")

	// b1 still live: Close says so, and its block stays.
	require.ErrorIs(t, a.Close(), cuda.ErrorIllegalState)
	rec.mu.Lock()
	assert.Len(t, rec.registered, 1, "the live block stays registered")
	rec.mu.Unlock()
	require.NoError(t, b1.Close()) // the last free gives it back
	rec.check(t)
	assert.Empty(t, up.live, "all memory back upstream")
}

// A failed Acquired gives the block back and fails the allocation; a
// failed Released keeps the block (still registered) for the next Trim.
func TestSegmentHooksFailures(t *testing.T) {
	rec := newSegRecorder()
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, Segments: rec.hooks()})
	rec.up = up

	rec.failAcq = errors.New("register refused")
	_, err := a.Allocate(saKiB, nil)
	require.Error(t, err)
	assert.ErrorIs(t, err, rec.failAcq)
	assert.Contains(t, err.Error(), "segment hook Acquired")
	assert.Empty(t, up.live, "the block went back")
	rec.failAcq = nil

	b, err := a.Allocate(saKiB, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	rec.failRel = errors.New("deregister refused")
	err = a.Trim()
	require.Error(t, err)
	assert.ErrorIs(t, err, rec.failRel)
	assert.Len(t, up.live, 1, "the block stays when Released fails")
	assert.Len(t, rec.registered, 1, "and stays registered")
	b, err = a.Allocate(saKiB, nil) // still usable
	require.NoError(t, err)
	require.NoError(t, b.Close())
	rec.failRel = nil
	require.NoError(t, a.Close())
	rec.check(t)
	assert.Empty(t, up.live)
}

// When giving a block back fails after Released, the block stays with the
// SubAllocator and is acquired again, so it is still released exactly
// once per acquire when it finally goes.
func TestSegmentHooksUpstreamFreeFails(t *testing.T) {
	rec := newSegRecorder()
	a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: saMiB, InitialSize: saMiB, Segments: rec.hooks()})
	rec.up = up
	up.freeErr = func(*cuda.Stream) error { return errors.New("upstream free refused") }
	require.Error(t, a.Trim())
	rec.mu.Lock()
	assert.Len(t, rec.registered, 1, "registered again after the failed give-back")
	rec.mu.Unlock()
	up.freeErr = nil
	require.NoError(t, a.Close())
	rec.check(t)
	for p, n := range rec.acquires {
		assert.Equal(t, 2, n, "%#x acquired twice (before and after the failed free)", p)
	}
}
