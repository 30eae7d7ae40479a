package resource

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Regression tests for unchecked arithmetic on user input (issue 6).

func TestPinnedPoolOptionsNUMANodeRange(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("int is 32 bits: no NUMA node can exceed the driver's range")
	}
	one := int64(1)       // variables, so 32-bit targets compile the conversions
	big := int(one << 32) // became node 0 through int32()
	o := PinnedPoolOptions{NUMANode: &big}
	err := o.check("linux")
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "NUMANode 4294967296")
	justOver := int(one<<31 + 0)
	o.NUMANode = &justOver
	require.ErrorIs(t, o.check("linux"), cuda.ErrInvalidArgument)
	ok := math.MaxInt32
	o.NUMANode = &ok
	require.NoError(t, o.check("linux"))
}

func TestPoolInitialReserveNear2to64(t *testing.T) {
	for _, n := range []uint64{math.MaxUint64, math.MaxUint64 - 1<<20, 1<<63 + 1} {
		d := DevicePoolOptions{InitialReserve: n}
		err := d.check("linux")
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "DevicePool reserve %d", n)
		assert.Contains(t, err.Error(), "InitialReserve")
		p := PinnedPoolOptions{InitialReserve: n}
		err = p.check("linux")
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "PinnedPool reserve %d", n)
		assert.Contains(t, err.Error(), "InitialReserve")
	}
	for _, m := range []uint64{math.MaxUint64, 1<<63 + 1} {
		d := DevicePoolOptions{MaxSize: m}
		err := d.check("linux")
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "MaxSize")
		p := PinnedPoolOptions{MaxSize: m}
		require.ErrorIs(t, p.check("linux"), cuda.ErrInvalidArgument)
	}
	p := PinnedPoolOptions{InitialReserve: 4 << 20, MaxSize: 2 << 20}
	require.ErrorIs(t, p.check("linux"), cuda.ErrInvalidArgument)
	p = PinnedPoolOptions{InitialReserve: 4 << 20, ReleaseThreshold: 1 << 20}
	require.ErrorIs(t, p.check("linux"), cuda.ErrInvalidArgument)
	p = PinnedPoolOptions{InitialReserve: 1 << 31}
	require.NoError(t, p.check("linux"))
}

func TestCheckSize(t *testing.T) {
	require.NoError(t, checkSize("op", "size", 0))
	require.NoError(t, checkSize("op", "size", maxRequest))
	err := checkSize("X.Allocate", "size", math.MaxUint64)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.True(t, strings.HasPrefix(err.Error(), "X.Allocate: "), err.Error())
	assert.Contains(t, err.Error(), "size 18446744073709551615")
}

// TestSubAllocatorRefusesWrappingBlock: an upstream returning a range
// that wraps past 2^64 must be refused (and given back), not carved into
// allocations at addresses that wrapped around.
func TestSubAllocatorRefusesWrappingBlock(t *testing.T) {
	for _, base := range []uint64{
		math.MaxUint64 - 4095, // the block's end wraps
		math.MaxUint64 - 127,  // aligning the start wraps to address 0 (was carved from 0)
	} {
		a, up, _ := newSA(t, &SubAllocatorOptions{GrowSize: 1 << 20})
		up.next = base
		_, err := a.Allocate(4096, nil)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "block at %#x", base)
		assert.Contains(t, err.Error(), "wraps")
		_, _, live := up.counts()
		assert.Zero(t, live, "the refused block went back to the upstream")
		assert.Zero(t, a.Stats().Reserved)
		require.NoError(t, a.Close())
	}
}

// TestStatisticsSaturates: byte counters stop at the maximum rather than
// wrapping around to small numbers.
func TestStatisticsSaturates(t *testing.T) {
	up := newSAUpstream()
	st := NewStatistics(up)
	b1, err := st.Allocate(1<<63+1, nil)
	require.NoError(t, err)
	b2, err := st.Allocate(1<<63+1, nil)
	require.NoError(t, err)
	s := st.Stats()
	assert.Equal(t, uint64(math.MaxUint64), s.CurrentBytes, "current bytes wrapped")
	assert.Equal(t, uint64(math.MaxUint64), s.PeakBytes)
	assert.Equal(t, uint64(math.MaxUint64), s.TotalBytes)
	require.NoError(t, b1.Close())
	require.NoError(t, b2.Close())
}

// TestTrackingLiveBytesSaturates: the sum of live sizes must not wrap.
func TestTrackingLiveBytesSaturates(t *testing.T) {
	up := newSAUpstream()
	tr := NewTracking(up, nil)
	b1, err := tr.Allocate(1<<63+1, nil)
	require.NoError(t, err)
	b2, err := tr.Allocate(1<<63+1, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(math.MaxUint64), tr.LiveBytes(), "live bytes wrapped")
	assert.Contains(t, tr.Report(), "18446744073709551615 bytes")
	require.NoError(t, b1.Close())
	require.NoError(t, b2.Close())
	assert.Zero(t, tr.LiveCount())
}

// TestSubAllocatorRejectBlockJoinsCloseError: a block the upstream got
// wrong is given back, and a failure to give it back is in the error.
func TestSubAllocatorRejectBlockJoinsCloseError(t *testing.T) {
	up := newSAUpstream()
	a, err := NewSubAllocator(up, &SubAllocatorOptions{GrowSize: 1 << 20})
	require.NoError(t, err)
	a.order = &saOrder{}
	up.offset = 8 // the upstream returns a block that cannot hold the request aligned
	boom := errors.New("give-back refused")
	up.freeErr = func(*cuda.Stream) error { return boom }
	_, err = a.Allocate(1<<20, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.ErrorIs(t, err, boom)
	assert.Zero(t, a.Stats().Reserved, "the bad block is not on the books")
	up.freeErr = nil
	require.NoError(t, a.Close())
	// The buffer that could not be given back is unreachable now: the
	// buffer package's safety net frees it (and counts it as a leak). Wait
	// for that here, so that the count does not change under a later
	// test's leak check.
	leaks := buffer.Leaks()
	for range 200 {
		if _, _, live := up.counts(); live == 0 && buffer.Leaks() > leaks {
			break
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	_, _, live := up.counts()
	assert.Zero(t, live, "the safety net gave the block back")
	assert.Equal(t, leaks+1, buffer.Leaks())
}
