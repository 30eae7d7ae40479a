package ipc

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// heldPool is an ExportablePool with Use, as resource.DevicePool and
// PinnedPool have it: Use runs fn with the pool held open.
type heldPool struct {
	closed bool
	uses   int
	inUse  bool
}

func (p *heldPool) AllocatePtr(uint64, *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0, nil, nil
}
func (p *heldPool) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (p *heldPool) DeviceAccessible() bool                                { return true }
func (p *heldPool) HostAccessible() bool                                  { return false }
func (p *heldPool) DeviceID() int                                         { return 0 }
func (p *heldPool) Pool() cuda.MemPool                                    { return cuda.MemPool{} }
func (p *heldPool) IsIPCEnabled() bool                                    { return true }
func (p *heldPool) IsClosed() bool                                        { return p.closed }
func (p *heldPool) Use(fn func(cuda.MemPool) error) error {
	if p.closed {
		return &cuda.OpError{Op: "heldPool.Use", Err: cuda.ErrClosed}
	}
	p.uses++
	p.inUse = true
	defer func() { p.inUse = false }()
	return fn(cuda.MemPool{})
}

// TestExportHoldsPoolOpen: driver calls on an exported pool run inside the
// pool's Use (held open against a concurrent Close), where the pool has it.
func TestExportHoldsPoolOpen(t *testing.T) {
	p := &heldPool{}
	ran := false
	require.NoError(t, withPool("test", p, func(cuda.MemPool) error {
		ran = true
		assert.True(t, p.inUse, "the driver call runs with the pool held")
		return nil
	}))
	assert.True(t, ran)
	assert.Equal(t, 1, p.uses)
	p.closed = true
	err := withPool("test", p, func(cuda.MemPool) error {
		t.Error("ran on a closed pool")
		return nil
	})
	assert.ErrorIs(t, err, cuda.ErrClosed)
}

// TestExportStateFollowsPool: each pool object has one export state (one
// UUID and key, however often it is exported), another pool another, and
// a pool's state goes when the pool is collected, so the table of export
// states never outgrows the pools alive.
func TestExportStateFollowsPool(t *testing.T) {
	type pool struct {
		_ [56]byte // not a tiny allocation: the cleanup runs
	}
	a, b := new(pool), new(pool)
	sa, sb := stateOf(a), stateOf(b)
	assert.Same(t, sa, stateOf(a), "one state per pool")
	assert.NotSame(t, sa, sb)
	assert.NotEqual(t, sa.uuid, sb.uuid)
	assert.False(t, sa.key.equal(sb.key))
	count := func() int {
		n := 0
		exportStates.Range(func(any, any) bool { n++; return true })
		return n
	}
	before := count()
	func() {
		for range 8 {
			stateOf(new(pool))
		}
	}()
	require.Equal(t, before+8, count())
	for i := 0; i < 1000 && count() > before; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	assert.Equal(t, before, count(), "the states of collected pools are gone")
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}
