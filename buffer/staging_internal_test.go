package buffer

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

func TestParallelCopy(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	for _, w := range []int{1, 2, 3, 8} {
		stageWorkers = w
		for _, n := range []int{0, 1, 4095, copyPiece, 2*copyPiece + 1, 3<<20 + 77, 9 << 20} {
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(i*7 + n)
			}
			dst := make([]byte, n+3)
			dst[n], dst[n+1], dst[n+2] = 1, 2, 3
			parallelCopy(dst[:n], src)
			if !bytes.Equal(dst[:n], src) {
				t.Fatalf("workers %d, %d bytes: copy differs", w, n)
			}
			assert.Equal(t, []byte{1, 2, 3}, dst[n:], "nothing written past the end")
		}
	}
}

func TestPointerPath(t *testing.T) {
	type inner struct {
		A [4]float64
		P *int
	}
	type outer struct {
		X  uint8
		In [2]inner
	}
	for _, c := range []struct {
		v    any
		want string
	}{
		{int32(0), ""},
		{[3]complex128{}, ""},
		{struct{ A, B uint16 }{}, ""},
		{[0]string{}, ""},
		{uintptr(0), ""},
		{unsafe.Pointer(nil), "T is a unsafe.Pointer"},
		{"", "T is a string"},
		{outer{}, "T.In[i].P is a ptr"},
		{[2][]int{}, "T[i] is a slice"},
	} {
		assert.Equal(t, c.want, pointerPath(reflect.TypeOf(c.v), "T"), "%T", c.v)
	}
}

// The CPU side of staging: moving 256 MiB of pageable memory into pinned-
// sized chunks with 1..8 goroutines.
func BenchmarkParallelCopy(b *testing.B) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	src := make([]byte, 256<<20)
	dst := make([]byte, 8<<20)
	for i := range src {
		src[i] = byte(i)
	}
	for _, w := range []int{1, 2, 4, 8} {
		b.Run("workers="+string(rune('0'+w)), func(b *testing.B) {
			stageWorkers = w
			b.SetBytes(int64(len(src)))
			for range b.N {
				for off := 0; off < len(src); off += len(dst) {
					parallelCopy(dst, src[off:off+len(dst)])
				}
			}
		})
	}
}

// fakeEngine is a DMA engine for the staging pipelines without a GPU: it
// runs the copies queued to it later, in order, on its own goroutine, as a
// stream does, with random delays. A pipeline that refilled a chunk before
// its DMA ran, or read one before its DMA landed, gets wrong bytes (and,
// under -race, a reported race).
type fakeEngine struct {
	dev     []byte // device memory; address fakeBase is dev[0]
	ops     chan func()
	rnd     *rand.Rand // used by the engine goroutine only
	calls   int
	failAt  int   // the failAt-th copy call fails (0: none)
	records int   // record calls so far
	recFail int   // the recFail-th record call fails (0: none)
	syncErr error // sync fails with this (a destroyed stream, say)

	// badRec: waiting for the end of the badRec-th recorded DMA fails
	// badFails more times (-1: always), though the DMA itself completes.
	badRec, badFails int
}

const fakeBase cuda.DevicePtr = 0x10000

var errFakeDMA = errors.New("fake DMA failure")

func newFakeEngine(t *testing.T, size int, seed int64) *fakeEngine {
	e := &fakeEngine{dev: make([]byte, size), ops: make(chan func(), 4096), rnd: rand.New(rand.NewSource(seed))}
	go func() {
		for op := range e.ops {
			if e.rnd.Intn(4) == 0 {
				time.Sleep(time.Duration(e.rnd.Intn(200)) * time.Microsecond)
			}
			op()
		}
	}()
	t.Cleanup(func() { close(e.ops) })
	return e
}

func (e *fakeEngine) htod(dst cuda.DevicePtr, src unsafe.Pointer, n uint64) error {
	if e.calls++; e.calls == e.failAt {
		return errFakeDMA
	}
	off := int(dst - fakeBase)
	e.ops <- func() { copy(e.dev[off:off+int(n)], unsafe.Slice((*byte)(src), n)) }
	return nil
}

func (e *fakeEngine) dtoh(dst unsafe.Pointer, src cuda.DevicePtr, n uint64) error {
	if e.calls++; e.calls == e.failAt {
		return errFakeDMA
	}
	off := int(src - fakeBase)
	e.ops <- func() { copy(unsafe.Slice((*byte)(dst), n), e.dev[off:off+int(n)]) }
	return nil
}

type chanWaiter chan struct{}

func (w chanWaiter) Sync() error { <-w; return nil }

func (e *fakeEngine) record(c *chunk) error {
	if e.records++; e.records == e.recFail {
		return errFakeDMA
	}
	w := make(chanWaiter)
	e.ops <- func() { close(w) }
	c.pending = w
	if e.records == e.badRec {
		c.pending = flakyWaiter{w, e}
	}
	return nil
}

// flakyWaiter is a recorded DMA end whose wait fails while e.badFails says.
type flakyWaiter struct {
	w chanWaiter
	e *fakeEngine
}

func (f flakyWaiter) Sync() error {
	if f.e.badFails != 0 {
		if f.e.badFails > 0 {
			f.e.badFails--
		}
		return errFakeDMA
	}
	return f.w.Sync()
}

func (e *fakeEngine) tail() waiter { return engineTail{e} }

// engineTail is the end of the work queued on e so far.
type engineTail struct{ e *fakeEngine }

func (t engineTail) Sync() error { return t.e.sync() }

func (e *fakeEngine) sync() error {
	if e.syncErr != nil {
		return e.syncErr
	}
	w := make(chanWaiter)
	e.ops <- func() { close(w) }
	return w.Sync()
}

// fakePool is a staging pool of Go memory.
func fakePool(chunkSize, chunks int) *stagePool {
	p := &stagePool{size: chunkSize, want: chunks}
	for range chunks {
		m := make([]byte, chunkSize)
		p.chunks = append(p.chunks, &chunk{host: unsafe.Pointer(&m[0]), mem: m})
	}
	return p
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) + seed + byte(i>>16)
	}
	return b
}

func TestStagingPipelines(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	for _, c := range []struct{ chunk, chunks, workers int }{
		{64 << 10, 1, 1}, {64 << 10, 1, 3}, {64 << 10, 2, 2}, {64 << 10, 4, 8},
		{1 << 20, 4, 3}, {1 << 20, 3, 16}, {300 << 10, 2, 5},
	} {
		for _, n := range []int{1, 4097, 256<<10 - 1, 1<<20 + 3, 5*c.chunk + 12345} {
			name := fmt.Sprintf("%dKiBx%d-w%d/%d", c.chunk>>10, c.chunks, c.workers, n)
			t.Run(name, func(t *testing.T) {
				stageWorkers = c.workers
				p := fakePool(c.chunk, c.chunks)
				e := newFakeEngine(t, n+100, int64(n))
				const at = 7

				src := pattern(n, 1)
				want := append([]byte(nil), src...)
				done, err := stagedHtoD(p, e, nil, fakeBase+at, src)
				require.True(t, done)
				require.NoError(t, err)
				for i := range src {
					src[i] = 0 // reusable once the call returns
				}
				require.NoError(t, e.sync())
				if !bytes.Equal(want, e.dev[at:at+n]) {
					t.Fatal("host to device: the device holds other bytes")
				}

				// A second copy right away reuses chunks with DMAs in flight.
				src = pattern(n, 2)
				done, err = stagedHtoD(p, e, nil, fakeBase+at, src)
				require.True(t, done)
				require.NoError(t, err)
				require.NoError(t, e.sync())
				if !bytes.Equal(pattern(n, 2), e.dev[at:at+n]) {
					t.Fatal("second host to device: the device holds other bytes")
				}

				copy(e.dev[at:], pattern(n, 3))
				dst := make([]byte, n)
				done, err = stagedDtoH(p, e, nil, dst, fakeBase+at)
				require.True(t, done)
				require.NoError(t, err)
				if !bytes.Equal(pattern(n, 3), dst) {
					t.Fatal("device to host: dst holds other bytes when the call returns")
				}
				assert.True(t, p.mu.TryLock(), "the pool is free again")
				p.mu.Unlock()
			})
		}
	}
}

func TestStagingFailure(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	stageWorkers = 4
	const n = 1<<20 + 5
	for _, failAt := range []int{1, 2, 5} {
		p := fakePool(128<<10, 3)
		e := newFakeEngine(t, n, int64(failAt))
		e.failAt = failAt
		done, err := stagedHtoD(p, e, nil, fakeBase, pattern(n, 1))
		assert.True(t, done)
		assert.ErrorIs(t, err, errFakeDMA)
		e.calls, e.failAt = 0, failAt
		done, err = stagedDtoH(p, e, nil, make([]byte, n), fakeBase)
		assert.True(t, done)
		assert.ErrorIs(t, err, errFakeDMA)
		assert.Len(t, p.chunks, 3, "the pool stays whole")

		e.failAt = 0
		src := pattern(n, 9)
		done, err = stagedHtoD(p, e, nil, fakeBase, src)
		require.True(t, done)
		require.NoError(t, err)
		require.NoError(t, e.sync())
		assert.True(t, bytes.Equal(src, e.dev), "a copy after a failure")
	}
}

// Issue 6: one staged copy failing on a stream that cannot even be
// drained (a destroyed stream: every call on it fails) turned staging off
// for the rest of the process. The next copy, on a good stream, must be
// staged as before, and as fast.
func TestStagingFailureIsNotSticky(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	stageWorkers = 4
	const n = 1<<20 + 5
	for _, dir := range []string{"htod", "dtoh"} {
		t.Run(dir, func(t *testing.T) {
			p := fakePool(128<<10, 3)
			bad := newFakeEngine(t, n, 1)
			bad.failAt, bad.syncErr = 1, cuda.ErrClosed
			var err error
			if dir == "htod" {
				_, err = stagedHtoD(p, bad, nil, fakeBase, pattern(n, 1))
			} else {
				_, err = stagedDtoH(p, bad, nil, make([]byte, n), fakeBase)
			}
			require.ErrorIs(t, err, errFakeDMA)

			good := newFakeEngine(t, n, 2)
			src := pattern(n, 4)
			done, err := stagedHtoD(p, good, nil, fakeBase, src)
			require.True(t, done, "the copy after the failure is staged")
			require.NoError(t, err)
			require.NoError(t, good.sync())
			assert.True(t, bytes.Equal(src, good.dev))
			dst := make([]byte, n)
			done, err = stagedDtoH(p, good, nil, dst, fakeBase)
			require.True(t, done, "and so is the one after it")
			require.NoError(t, err)
			assert.True(t, bytes.Equal(src, dst))
			assert.Len(t, p.chunks, 3, "no chunk was given up: nothing was in flight")
			assert.Empty(t, p.aside)
			assert.EqualValues(t, 2, p.staged.Load())
		})
	}
}

// A DMA queued whose end could not be recorded, on a queue that cannot be
// drained either: its chunk may still be written by the engine, so it is
// set aside, and the next copy gets a fresh one from the allocator. Once
// the queue drains, the chunk set aside is freed (the pool is whole).
func TestStagingRetiresUnsettledChunk(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	stageWorkers = 2
	const n = 1<<20 + 5
	p := fakePool(128<<10, 3)
	allocs := 0
	p.newChunk = func(_ *cuda.Device, size int) (*chunk, error) {
		allocs++
		m := make([]byte, size)
		return &chunk{host: unsafe.Pointer(&m[0]), mem: m}, nil
	}
	bad := newFakeEngine(t, n, 3)
	bad.recFail, bad.syncErr = 2, cuda.ErrClosed
	_, err := stagedHtoD(p, bad, nil, fakeBase, pattern(n, 1))
	require.ErrorIs(t, err, errFakeDMA)
	assert.Len(t, p.chunks, 2, "the chunk whose DMA may still run is out of the pool")
	require.Len(t, p.aside, 1)
	lost := p.aside[0]
	for _, c := range p.chunks {
		assert.False(t, c.queued)
	}

	good := newFakeEngine(t, n, 4)
	src := pattern(n, 5)
	done, err := stagedHtoD(p, good, nil, fakeBase, src)
	require.True(t, done)
	require.NoError(t, err)
	require.NoError(t, good.sync())
	assert.True(t, bytes.Equal(src, good.dev))
	assert.Equal(t, 1, allocs, "topped up with one new chunk")
	assert.Len(t, p.chunks, 3)
	assert.Equal(t, []*chunk{lost}, p.aside, "still unsettled: kept aside, not freed")
	assert.NotNil(t, lost.mem)

	// The same failure on a queue that drains keeps every chunk.
	bad2 := newFakeEngine(t, n, 5)
	bad2.recFail = 1
	_, err = stagedDtoH(p, bad2, nil, make([]byte, n), fakeBase)
	require.ErrorIs(t, err, errFakeDMA)
	assert.Len(t, p.chunks, 3)
	assert.Len(t, p.aside, 1)

	// The first queue drains at last: the next copy frees the chunk set
	// aside, since the pool was topped up meanwhile.
	bad.syncErr = nil
	done, err = stagedHtoD(p, good, nil, fakeBase, src)
	require.True(t, done)
	require.NoError(t, err)
	assert.Empty(t, p.aside, "reclaimed")
	assert.True(t, lost.released)
	assert.Nil(t, lost.mem, "freed")
	assert.Len(t, p.chunks, 3)
	assert.Equal(t, 1, allocs)
}

// Issue 6 (fault sweep: CopyFromHost/CopyToHost staged with
// cuEventSynchronize failing): a failed wait for a chunk's last DMA
// retired the chunk for good, and the next copy allocated another, so
// every such failure leaked a pinned chunk and its event. A failed wait
// that succeeds when tried again leaves the pool as it was: same chunks,
// no allocation, nothing set aside.
func TestStagingFailedWaitKeepsChunk(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	stageWorkers = 3
	const n = 1<<20 + 5 // 9 pieces over 3 chunks: every chunk is reused
	for _, dir := range []string{"htod", "dtoh"} {
		t.Run(dir, func(t *testing.T) {
			p := fakePool(128<<10, 3)
			before := append([]*chunk(nil), p.chunks...)
			allocs := 0
			p.newChunk = func(_ *cuda.Device, size int) (*chunk, error) {
				allocs++
				m := make([]byte, size)
				return &chunk{host: unsafe.Pointer(&m[0]), mem: m}, nil
			}
			e := newFakeEngine(t, n, 8)
			e.badRec, e.badFails = 1, 1 // the wait to reuse chunk 0 fails once
			var err error
			if dir == "htod" {
				_, err = stagedHtoD(p, e, nil, fakeBase, pattern(n, 1))
			} else {
				_, err = stagedDtoH(p, e, nil, make([]byte, n), fakeBase)
			}
			require.ErrorIs(t, err, errFakeDMA, "the failure is reported")
			assert.Zero(t, e.badFails, "the failing wait was reached")
			assert.Len(t, p.chunks, 3, "no chunk left the pool")

			src := pattern(n, 6)
			done, err := stagedHtoD(p, e, nil, fakeBase, src)
			require.True(t, done)
			require.NoError(t, err)
			require.NoError(t, e.sync())
			assert.True(t, bytes.Equal(src, e.dev))
			assert.Zero(t, allocs, "nothing was allocated to replace a chunk")
			assert.ElementsMatch(t, before, p.chunks, "the same chunks")
		})
	}
}

// A chunk whose DMA cannot be waited for at all (the wait keeps failing)
// is set aside, neither used nor freed; a copy meanwhile tops the pool up.
// Once the wait works again, the next copy frees the chunk set aside: it
// is not lost for good, and the pool is back to its size.
func TestStagingChunkAsideIsReclaimed(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	stageWorkers = 2
	const n = 1<<20 + 5
	p := fakePool(128<<10, 3)
	stuck := p.chunks[0]
	allocs := 0
	p.newChunk = func(_ *cuda.Device, size int) (*chunk, error) {
		allocs++
		m := make([]byte, size)
		return &chunk{host: unsafe.Pointer(&m[0]), mem: m}, nil
	}
	e := newFakeEngine(t, n, 9)
	e.badRec, e.badFails = 1, -1
	_, err := stagedHtoD(p, e, nil, fakeBase, pattern(n, 1))
	require.ErrorIs(t, err, errFakeDMA)
	assert.Equal(t, []*chunk{stuck}, p.aside)
	assert.Len(t, p.chunks, 2)

	// Still stuck: a small copy (one piece) runs on a topped-up pool.
	src := pattern(64<<10, 2)
	done, err := stagedHtoD(p, e, nil, fakeBase, src)
	require.True(t, done)
	require.NoError(t, err)
	assert.Equal(t, 1, allocs)
	assert.Equal(t, []*chunk{stuck}, p.aside)
	assert.NotNil(t, stuck.mem, "not freed while its DMA may run")

	// The wait works again: freed by the next copy.
	e.badFails = 0
	src = pattern(n, 3)
	done, err = stagedHtoD(p, e, nil, fakeBase, src)
	require.True(t, done)
	require.NoError(t, err)
	require.NoError(t, e.sync())
	assert.True(t, bytes.Equal(src, e.dev))
	assert.Empty(t, p.aside)
	assert.True(t, stuck.released)
	assert.Len(t, p.chunks, 3)
	assert.Equal(t, 1, allocs)

	// With the pool short instead, a chunk set aside goes back into it.
	p2 := fakePool(128<<10, 3)
	p2.newChunk = func(*cuda.Device, int) (*chunk, error) { return nil, cuda.ErrorOutOfMemory }
	stuck2 := p2.chunks[0]
	e2 := newFakeEngine(t, n, 10)
	e2.badRec, e2.badFails = 1, -1
	_, err = stagedDtoH(p2, e2, nil, make([]byte, n), fakeBase)
	require.ErrorIs(t, err, errFakeDMA)
	require.Equal(t, []*chunk{stuck2}, p2.aside)
	e2.badFails = 0
	require.NoError(t, e2.sync()) // the failed copy's DMAs read e2.dev
	copy(e2.dev, pattern(n, 4))
	dst := make([]byte, n)
	done, err = stagedDtoH(p2, e2, nil, dst, fakeBase)
	require.True(t, done)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(pattern(n, 4), dst))
	assert.Empty(t, p2.aside)
	assert.Contains(t, p2.chunks, stuck2, "taken back into the pool")
	assert.False(t, stuck2.released)
}

// Issue 6 (fault sweep, first use k=19/20: cuMemHostAlloc failing): a
// failed pinned allocation turned staging off for a second, so the copies
// right after it went to the driver (several times slower). Only the copy
// that met the failure goes to the driver; the next one allocates again.
func TestStagingAllocFailureIsRetried(t *testing.T) {
	defer func(w, k int) { stageWorkers, stageChunks = w, k }(stageWorkers, stageChunks)
	stageWorkers, stageChunks = 2, 2
	fail := true
	allocs := 0
	p := &stagePool{}
	p.newChunk = func(_ *cuda.Device, size int) (*chunk, error) {
		allocs++
		if fail {
			return nil, cuda.ErrorOutOfMemory
		}
		m := make([]byte, size)
		return &chunk{host: unsafe.Pointer(&m[0]), mem: m}, nil
	}
	const n = 1 << 20
	e := newFakeEngine(t, n, 6)
	done, err := stagedHtoD(p, e, nil, fakeBase, pattern(n, 1))
	assert.False(t, done, "no pinned memory: the driver copies")
	assert.NoError(t, err)
	assert.ErrorIs(t, p.allocErr, cuda.ErrorOutOfMemory)
	assert.True(t, p.mu.TryLock(), "no lock left held")
	p.mu.Unlock()

	fail = false
	src := pattern(n, 2)
	done, err = stagedHtoD(p, e, nil, fakeBase, src)
	require.True(t, done, "retried on the next copy, and staged")
	require.NoError(t, err)
	require.NoError(t, e.sync())
	assert.True(t, bytes.Equal(src, e.dev))
	assert.Len(t, p.chunks, 2)
	assert.Equal(t, 3, allocs)

	// A failure part-way keeps the chunks already allocated; the next
	// copy allocates only the rest.
	p2 := &stagePool{}
	allocs = 0
	p2.newChunk = func(_ *cuda.Device, size int) (*chunk, error) {
		if allocs++; allocs == 2 {
			return nil, cuda.ErrorOutOfMemory
		}
		m := make([]byte, size)
		return &chunk{host: unsafe.Pointer(&m[0]), mem: m}, nil
	}
	done, err = stagedHtoD(p2, e, nil, fakeBase, pattern(n, 3))
	require.True(t, done, "staged through the one chunk it got")
	require.NoError(t, err)
	require.Len(t, p2.chunks, 1)
	first := p2.chunks[0]
	src = pattern(n, 4)
	done, err = stagedHtoD(p2, e, nil, fakeBase, src)
	require.True(t, done)
	require.NoError(t, err)
	require.NoError(t, e.sync())
	assert.True(t, bytes.Equal(src, e.dev))
	assert.Len(t, p2.chunks, 2, "topped up on the next copy")
	assert.Same(t, first, p2.chunks[0])
	assert.Equal(t, 3, allocs)
}

// A pool that cannot allocate through a nil device (a zero stream's)
// declines without panicking and without holding its lock.
func TestStagingNilDevice(t *testing.T) {
	p := &stagePool{newChunk: allocChunk}
	e := newFakeEngine(t, 1<<20, 7)
	done, err := stagedHtoD(p, e, nil, fakeBase, make([]byte, 1<<20))
	assert.False(t, done)
	assert.NoError(t, err)
	require.ErrorIs(t, p.allocErr, cuda.ErrInvalidArgument)
	assert.True(t, p.mu.TryLock())
	p.mu.Unlock()
}

// A panic in the queue's calls leaves the pool unlocked and usable.
func TestStagingPanicReleasesPool(t *testing.T) {
	p := fakePool(64<<10, 2)
	func() {
		defer func() { assert.NotNil(t, recover()) }()
		_, _ = stagedHtoD(p, panicQueue{}, nil, fakeBase, make([]byte, 1<<20))
	}()
	assert.True(t, p.mu.TryLock(), "the lock was released")
	p.mu.Unlock()
	assert.Len(t, p.chunks, 2)
}

type panicQueue struct{}

func (panicQueue) htod(cuda.DevicePtr, unsafe.Pointer, uint64) error { panic("boom") }
func (panicQueue) dtoh(unsafe.Pointer, cuda.DevicePtr, uint64) error { panic("boom") }
func (panicQueue) record(*chunk) error                               { panic("boom") }
func (panicQueue) sync() error                                       { panic("boom") }
func (panicQueue) tail() waiter                                      { panic("boom") }

func TestStagingBusyPool(t *testing.T) {
	p := fakePool(64<<10, 2)
	e := newFakeEngine(t, 1<<20, 1)
	p.mu.Lock()
	done, err := stagedHtoD(p, e, nil, fakeBase, make([]byte, 1<<20))
	assert.False(t, done, "a busy pool sends the copy to the driver")
	assert.NoError(t, err)
	done, err = stagedDtoH(p, e, nil, make([]byte, 1<<20), fakeBase)
	assert.False(t, done)
	assert.NoError(t, err)
	p.mu.Unlock()
	empty := &stagePool{}
	done, _ = stagedHtoD(empty, e, nil, fakeBase, make([]byte, 1<<20))
	assert.False(t, done, "a pool with no chunks too")
}

// FuzzStaging runs staged copies of any size through pools of any shape,
// with a DMA, an event record, the drain or a wait for a recorded DMA
// (recFail's high bits: which one, and once, twice or always) failing
// anywhere, on the fake engine: a copy with no failure moves the right bytes; a failed one
// returns the failure, leaves the pool unlocked and whole (or short of
// the chunks it set aside, which are then replaced), and the next copy is
// staged and right.
func FuzzStaging(f *testing.F) {
	f.Add(uint32(1<<20+5), uint8(2), uint8(3), uint8(4), uint8(0), uint8(0), false)
	f.Add(uint32(300<<10), uint8(1), uint8(1), uint8(1), uint8(2), uint8(0), true)
	f.Add(uint32(5<<20), uint8(16), uint8(2), uint8(3), uint8(0), uint8(3), true)
	f.Add(uint32(1), uint8(0), uint8(4), uint8(8), uint8(1), uint8(1), false)
	f.Add(uint32(1<<20+5), uint8(1), uint8(2), uint8(4), uint8(0), uint8(1<<6|1<<3), false)
	f.Add(uint32(1<<20+5), uint8(1), uint8(2), uint8(4), uint8(0), uint8(3<<6|2<<3), true)
	f.Fuzz(func(t *testing.T, n uint32, chunkKiB, chunks, workers, failAt, recFail uint8, syncFail bool) {
		defer func(w int) { stageWorkers = w }(stageWorkers)
		size := int(n%(6<<20)) + 1
		chunkSize := (int(chunkKiB%32) + 1) * 64 << 10
		k := int(chunks%4) + 1
		stageWorkers = int(workers%8) + 1
		p := fakePool(chunkSize, k)
		p.newChunk = func(_ *cuda.Device, size int) (*chunk, error) {
			m := make([]byte, size)
			return &chunk{host: unsafe.Pointer(&m[0]), mem: m}, nil
		}
		e := newFakeEngine(t, size, int64(n))
		e.failAt, e.recFail = int(failAt%8), int(recFail%8)
		e.badRec, e.badFails = int(recFail>>3)%8, [...]int{0, 1, 2, -1}[recFail>>6]
		if syncFail {
			e.syncErr = cuda.ErrClosed
		}
		src := pattern(size, byte(n))
		done, err := stagedHtoD(p, e, nil, fakeBase, src)
		if !done {
			t.Fatal("the pool was not used")
		}
		failed := err != nil
		if failed && !errors.Is(err, errFakeDMA) {
			t.Fatalf("unexpected error %v", err)
		}
		if !p.mu.TryLock() {
			t.Fatal("the pool is still locked")
		}
		p.mu.Unlock()
		if len(p.chunks)+len(p.aside) != k {
			t.Fatalf("%d chunks and %d set aside, of %d", len(p.chunks), len(p.aside), k)
		}
		if !failed {
			e.syncErr = nil
			if err := e.sync(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(src, e.dev) {
				t.Fatal("host to device: other bytes")
			}
		}
		dst := make([]byte, size)
		done, err = stagedDtoH(p, e, nil, dst, fakeBase)
		if !done || err != nil && !errors.Is(err, errFakeDMA) {
			t.Fatalf("device to host: done %v, %v", done, err)
		}
		if err == nil && !failed && !bytes.Equal(src, dst) {
			t.Fatal("device to host: other bytes")
		}

		// The failures end (the DMAs a chunk set aside waits for can now
		// be waited for), and a good engine comes: staged, and right.
		e.syncErr, e.badFails = nil, 0
		good := newFakeEngine(t, size, 1)
		src = pattern(size, byte(n)+1)
		if done, err := stagedHtoD(p, good, nil, fakeBase, src); !done || err != nil {
			t.Fatalf("after a failure: done %v, %v", done, err)
		}
		if err := good.sync(); err != nil || !bytes.Equal(src, good.dev) {
			t.Fatalf("after a failure: other bytes (%v)", err)
		}
		if len(p.chunks) != k || len(p.aside) != 0 {
			t.Fatalf("the pool is not whole: %d of %d chunks, %d set aside", len(p.chunks), k, len(p.aside))
		}
	})
}
