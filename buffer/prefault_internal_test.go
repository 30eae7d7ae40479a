package buffer

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/staging"
)

// prefaultAhead stands for PrefaultPopulate with goroutines of their own
// mapping pages ahead (stageAhead) in the variants below.
const prefaultAhead staging.Prefault = 99

// pollWaiter is a fake DMA end that can also be polled, as a cuda.Event
// can: the eager pipeline polls it while it watches the workers.
type pollWaiter struct{ chanWaiter }

func (w pollWaiter) Done() (bool, error) {
	select {
	case <-w.chanWaiter:
		return true, nil
	default:
		return false, nil
	}
}

// pollEngine is a fakeEngine whose recorded DMA ends can be polled.
type pollEngine struct{ *fakeEngine }

func (e pollEngine) record(c *chunk) error {
	if err := e.fakeEngine.record(c); err != nil {
		return err
	}
	if w, ok := c.pending.(chanWaiter); ok {
		c.pending = pollWaiter{w}
	}
	return nil
}

// Copies out of a device under every prefault mode, eager or not, with
// pollable DMA ends or not, land the right bytes and nothing outside dst;
// and with the counters on, they are counted.
func TestStagingDtoHVariants(t *testing.T) {
	defer func(w, o, f int, pf staging.Prefault, eager bool, ahead int) {
		stageWorkers, stageOutWorkers, stageFreshWorkers, stagePrefault, stageEager, stageAhead = w, o, f, pf, eager, ahead
	}(stageWorkers, stageOutWorkers, stageFreshWorkers, stagePrefault, stageEager, stageAhead)
	stageFreshWorkers = 0 // out workers whatever dst's pages (TestStagingFreshWorkers)
	defer staging.Profile.Store(staging.Profile.Load())
	staging.Profile.Store(true)
	for _, pf := range []staging.Prefault{staging.PrefaultOff, staging.PrefaultTouch, staging.PrefaultPopulate, prefaultAhead} {
		for _, eager := range []bool{false, true} {
			for _, poll := range []bool{false, true} {
				for _, out := range []int{1, 3, 8} {
					for _, shape := range []struct{ chunk, chunks int }{{64 << 10, 1}, {64 << 10, 2}, {256 << 10, 4}} {
						name := fmt.Sprintf("%v/eager=%v/poll=%v/out=%d/%dKiBx%d", pf, eager, poll, out, shape.chunk>>10, shape.chunks)
						t.Run(name, func(t *testing.T) {
							stageWorkers, stageOutWorkers, stagePrefault, stageEager, stageAhead = 2, out, pf, eager, 0
							if pf == prefaultAhead {
								stagePrefault, stageAhead = staging.PrefaultPopulate, 3
							}
							for _, n := range []int{1, 5000, 3*shape.chunk + 4097} {
								p := fakePool(shape.chunk, shape.chunks)
								fe := newFakeEngine(t, n+100, int64(n))
								var q dmaQueue = fe
								if poll {
									q = pollEngine{fe}
								}
								const at = 5
								copy(fe.dev[at:], pattern(n, 4))
								// Guard bytes on both sides, and a fresh
								// middle of pages never written.
								whole := make([]byte, n+2*pageSize)
								whole[pageSize-1], whole[pageSize+n] = 0xa5, 0x5a
								dst := whole[pageSize : pageSize+n]
								before := staging.Read()
								done, err := stagedDtoH(p, q, nil, dst, fakeBase+at)
								require.True(t, done)
								require.NoError(t, err)
								if !bytes.Equal(pattern(n, 4), dst) {
									t.Fatalf("%d bytes: dst holds other bytes", n)
								}
								assert.Equal(t, byte(0xa5), whole[pageSize-1], "the byte before dst")
								assert.Equal(t, byte(0x5a), whole[pageSize+n], "the byte after dst")
								d := staging.Read().Sub(before)
								assert.Equal(t, int64(1), d.Copies)
								assert.Equal(t, int64(n), d.Bytes)
								assert.Equal(t, int64(min(out, runtime.GOMAXPROCS(0))), d.Workers, "workers (capped by GOMAXPROCS)")
							}
						})
					}
				}
			}
		}
	}
}

func TestPrefaultModes(t *testing.T) {
	for _, mode := range []staging.Prefault{staging.PrefaultOff, staging.PrefaultTouch, staging.PrefaultPopulate} {
		for _, n := range []int{1, pageSize - 1, pageSize, 3*pageSize + 17, 1 << 20} {
			for _, skew := range []int{0, 1, 100} {
				b := make([]byte, n+skew+1)
				b[n+skew] = 7
				prefault(b[skew:skew+n], mode)
				assert.Equal(t, byte(7), b[n+skew], "%v, %d bytes at +%d: the byte past the range", mode, n, skew)
				if mode != staging.PrefaultOff {
					if w := pageRange(b[skew:skew+n], pageSize); w != nil {
						assert.True(t, mappedOrUnknown(w), "%v, %d bytes at +%d: pages mapped after prefault", mode, n, skew)
					}
				}
			}
		}
	}
}

func TestPageRange(t *testing.T) {
	b := make([]byte, 5*pageSize)
	base := int(addrOf(b))
	r := pageRange(b, pageSize)
	require.NotNil(t, r)
	assert.Zero(t, int(addrOf(r))%pageSize, "aligned start")
	assert.Zero(t, len(r)%pageSize, "whole pages")
	assert.GreaterOrEqual(t, int(addrOf(r)), base)
	assert.LessOrEqual(t, int(addrOf(r))+len(r), base+len(b))
	assert.GreaterOrEqual(t, len(r), 4*pageSize)
	assert.Nil(t, pageRange(b[1:2], pageSize))
	assert.Nil(t, pageRange(nil, pageSize))
}

func TestStagingParamsRoundTrip(t *testing.T) {
	old := staging.Current()
	t.Cleanup(func() { require.NoError(t, staging.Set(old)) })
	p := old
	p.MinBytes, p.OutMinBytes, p.ChunkSize, p.Chunks, p.InWorkers, p.OutWorkers = 1<<20, 2<<20, 1<<20, 3, 2, 5
	p.Prefault, p.HugePages, p.Eager, p.FreshWorkers = staging.PrefaultTouch, true, false, 7
	require.NoError(t, staging.Set(p))
	assert.Equal(t, p, staging.Current())
	p.Prefault, p.Ahead = staging.PrefaultPopulate, 4
	require.NoError(t, staging.Set(p))
	assert.Equal(t, p, staging.Current())
	assert.Equal(t, int64(1<<20), stageMinBytes.Load())
	assert.Equal(t, int64(2<<20), stageOutMinBytes.Load())
	for _, bad := range []staging.Params{
		{MinBytes: -1, ChunkSize: 1 << 20, Chunks: 1, InWorkers: 1, OutWorkers: 1},
		{ChunkSize: 1000, Chunks: 1, InWorkers: 1, OutWorkers: 1},
		{ChunkSize: 1 << 20, Chunks: 0, InWorkers: 1, OutWorkers: 1},
		{ChunkSize: 1 << 20, Chunks: 1, InWorkers: 0, OutWorkers: 1},
		{ChunkSize: 1 << 20, Chunks: 1, InWorkers: 1, OutWorkers: 1, Prefault: 9},
		{ChunkSize: 1 << 20, Chunks: 1, InWorkers: 1, OutWorkers: 1, Prefault: staging.PrefaultTouch, Ahead: 2},
	} {
		assert.Error(t, staging.Set(bad), "%v", bad)
	}
	assert.Equal(t, p, staging.Current(), "a refused Set changes nothing")
}

// failingPoll is a DMA end whose poll fails (its wait does not).
type failingPoll struct{ chanWaiter }

func (failingPoll) Done() (bool, error) { return false, errFakeDMA }

type failingPollEngine struct{ *fakeEngine }

func (e failingPollEngine) record(c *chunk) error {
	if err := e.fakeEngine.record(c); err != nil {
		return err
	}
	if w, ok := c.pending.(chanWaiter); ok {
		c.pending = failingPoll{w}
	}
	return nil
}

// An eager copy whose poll of a DMA fails reports it, and leaves the pool
// usable: the next copy lands the right bytes.
func TestStagingDtoHPollFailure(t *testing.T) {
	defer func(w int, eager bool) { stageWorkers, stageEager = w, eager }(stageWorkers, stageEager)
	stageWorkers, stageEager = 2, true
	p := fakePool(64<<10, 2)
	const n = 6 << 16
	e := newFakeEngine(t, n, 1)
	copy(e.dev, pattern(n, 5))
	dst := make([]byte, n)
	done, err := stagedDtoH(p, failingPollEngine{e}, nil, dst, fakeBase)
	require.True(t, done)
	require.ErrorIs(t, err, errFakeDMA)
	assert.True(t, p.mu.TryLock(), "the pool is free again")
	p.mu.Unlock()
	done, err = stagedDtoH(p, pollEngine{e}, nil, dst, fakeBase)
	require.True(t, done)
	require.NoError(t, err)
	assert.Equal(t, pattern(n, 5), dst)
}
