package resource_test

// CPU tests of the adaptors (Limiting, Statistics, Tracking) over a fake
// upstream that hands out made-up addresses: nothing here reaches the
// driver, so they run everywhere, CI included.

import (
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// recordingResource is a fake upstream: made-up addresses from a counter,
// books of what is live, and switches to make calls fail. Its buffers
// must never reach the driver (nothing in these tests asks it to).
type recordingResource struct {
	mu         sync.Mutex
	next       cuda.DevicePtr
	live       map[cuda.DevicePtr]uint64
	bytes      uint64 // live bytes
	maxBytes   uint64 // the most bytes ever live at once
	allocs     int    // successful Allocate calls, size 0 included
	frees      int    // successful Deallocate calls
	failAllocs int    // fail this many Allocate calls with out-of-memory
	failFrees  int    // fail this many Deallocate calls
	lastStream *cuda.Stream
	devID      int
	hostAcc    bool
}

func newRecording() *recordingResource {
	return &recordingResource{next: 0x7f00_0000_0000, live: map[cuda.DevicePtr]uint64{}, devID: 7}
}

func (m *recordingResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failAllocs > 0 {
		m.failAllocs--
		return 0, nil, &cuda.OpError{Op: "fake.Allocate", Err: fmt.Errorf("%d bytes: %w", size, cuda.ErrorOutOfMemory)}
	}
	m.allocs++
	if size == 0 {
		return 0, s, nil
	}
	p := m.next
	m.next += cuda.DevicePtr((size+255)&^255 + 256)
	m.live[p] = size
	m.bytes += size
	m.maxBytes = max(m.maxBytes, m.bytes)
	return p, s, nil
}

func (m *recordingResource) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if p == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failFrees > 0 {
		m.failFrees--
		return &cuda.OpError{Op: "fake.Deallocate", Err: cuda.ErrorInvalidValue}
	}
	if got, ok := m.live[p]; !ok || got != size {
		return cuda.Errorf("fake.Deallocate", cuda.ErrInvalidArgument, "%#x (%d bytes) not live here (%d, %v)", uint64(p), size, got, ok)
	}
	delete(m.live, p)
	m.bytes -= size
	m.frees++
	m.lastStream = s
	return nil
}

func (m *recordingResource) DeviceAccessible() bool { return true }
func (m *recordingResource) HostAccessible() bool   { return m.hostAcc }
func (m *recordingResource) DeviceID() int          { return m.devID }
func (m *recordingResource) String() string         { return "fake" }

// counts returns the fake's books under its lock.
func (m *recordingResource) counts() (live int, bytes, maxBytes uint64, allocs, frees int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live), m.bytes, m.maxBytes, m.allocs, m.frees
}

func (m *recordingResource) fail(allocs, frees int) {
	m.mu.Lock()
	m.failAllocs, m.failFrees = allocs, frees
	m.mu.Unlock()
}

// requireEmpty asserts the fake holds nothing.
func (m *recordingResource) requireEmpty(t *testing.T) {
	t.Helper()
	live, bytes, _, _, _ := m.counts()
	require.Zero(t, live, "fake allocations still live")
	require.Zero(t, bytes)
}

func allocOK(t testing.TB, mr buffer.MemoryResource, size uint64) *buffer.Buffer {
	t.Helper()
	b, err := buffer.Allocate(mr, size, nil)
	require.NoError(t, err)
	require.Equal(t, size, b.Size())
	return b
}

// --- Limiting ---

func TestLimitingBoundary(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	lim := resource.NewLimiting(fake, 4096)
	assert.Equal(t, uint64(4096), lim.Limit())

	full := allocOK(t, lim, 4096) // exactly the limit
	assert.Same(t, lim, full.Resource(), "the adaptor owns its buffers")
	assert.Equal(t, uint64(4096), lim.Used())

	_, _, _, allocs, _ := fake.counts()
	b, err := lim.Allocate(1, nil)
	assert.Nil(t, b)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Equal(t, "Limiting.Allocate: 1 bytes would exceed the limit of 4096 bytes (4096 in use): CUDA_ERROR_OUT_OF_MEMORY", err.Error())
	_, _, _, after, _ := fake.counts()
	assert.Equal(t, allocs, after, "a refused request never reaches the upstream")

	empty := allocOK(t, lim, 0) // size 0 always fits
	assert.Zero(t, empty.Ptr())
	closeBuf(t, empty)
	assert.Equal(t, uint64(4096), lim.Used())

	closeBuf(t, full)
	assert.Zero(t, lim.Used())

	_, err = lim.Allocate(4097, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "4097 bytes would exceed the limit of 4096 bytes (0 in use)")
	_, err = lim.Allocate(math.MaxUint64, nil) // no overflow in the check
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)

	a := allocOK(t, lim, 3000)
	c := allocOK(t, lim, 1096) // 3000 + 1096 = 4096: fits exactly
	_, err = lim.Allocate(1, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "(4096 in use)")
	closeBuf(t, a)
	closeBuf(t, c)
	assert.Zero(t, lim.Used())
	fake.requireEmpty(t)
	assert.Contains(t, lim.String(), "Limiting(0 of 4096 bytes used, fake)")

	zero := resource.NewLimiting(fake, 0)
	_, err = zero.Allocate(1, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	closeBuf(t, allocOK(t, zero, 0))
}

func TestLimitingUpstreamErrors(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	lim := resource.NewLimiting(fake, 1<<20)

	// An upstream failure comes back unchanged and gives the bytes back.
	fake.fail(1, 0)
	_, err := lim.Allocate(1024, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Equal(t, "fake.Allocate: 1024 bytes: CUDA_ERROR_OUT_OF_MEMORY", err.Error())
	assert.Zero(t, lim.Used())

	// A failed free keeps the bytes counted until the retry succeeds.
	b := allocOK(t, lim, 1024)
	fake.fail(0, 1)
	require.ErrorIs(t, b.Close(), cuda.ErrorInvalidValue)
	assert.False(t, b.IsClosed())
	assert.Equal(t, uint64(1024), lim.Used())
	closeBuf(t, b)
	assert.Zero(t, lim.Used())

	// Memory the Limiting never counted is forwarded, and the count does
	// not wrap below zero.
	direct, err := buffer.Allocate(fake, 512, nil)
	require.NoError(t, err)
	p, n, err := direct.Disown()
	require.NoError(t, err)
	kept := allocOK(t, lim, 100)
	require.NoError(t, lim.Deallocate(p, n, nil))
	assert.Zero(t, lim.Used(), "saturates at zero")
	closeBuf(t, kept)
	assert.Zero(t, lim.Used())
	fake.requireEmpty(t)
}

// TestLimitingConcurrent: many goroutines allocating and freeing at once
// never take the upstream past the limit, and the books balance at the
// end. Run it with -race.
func TestLimitingConcurrent(t *testing.T) {
	checkBufferLeaks(t)
	const (
		limit   = 16 * kib // below what one worker may hold (4 buffers of up to 8 KiB)
		workers = 32
		rounds  = 3000
	)
	fake := newRecording()
	lim := resource.NewLimiting(fake, limit)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var sampled atomic.Uint64
	go func() { // watch Used while the workers run
		for {
			select {
			case <-stop:
				return
			default:
				sampled.Store(max(sampled.Load(), lim.Used()))
				runtime.Gosched()
			}
		}
	}()
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var held []*buffer.Buffer
			for range rounds {
				b, err := lim.Allocate(1+rng.Uint64N(8*kib), nil)
				if err != nil {
					if !assert.ErrorIs(t, err, cuda.ErrorOutOfMemory) {
						return
					}
					refused.Add(1)
				} else {
					ok.Add(1)
					held = append(held, b)
				}
				if len(held) > 0 && (len(held) > 3 || rng.IntN(2) == 0) {
					i := rng.IntN(len(held))
					assert.NoError(t, held[i].Close())
					held = append(held[:i], held[i+1:]...)
				}
			}
			for _, b := range held {
				assert.NoError(t, b.Close())
			}
		}()
	}
	close(start)
	wg.Wait()
	close(stop)
	_, _, maxBytes, _, _ := fake.counts()
	assert.LessOrEqual(t, maxBytes, uint64(limit), "the upstream never held more than the limit")
	assert.LessOrEqual(t, sampled.Load(), uint64(limit))
	assert.Positive(t, ok.Load())
	assert.Positive(t, refused.Load(), "the workload should hit the limit")
	assert.Zero(t, lim.Used())
	fake.requireEmpty(t)
}

// --- Statistics ---

func TestStatistics(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	st := resource.NewStatistics(fake)
	assert.Equal(t, resource.Stats{}, st.Stats())

	a := allocOK(t, st, 100)
	b := allocOK(t, st, 200)
	c := allocOK(t, st, 300)
	assert.Same(t, st, a.Resource())
	assert.Equal(t, resource.Stats{CurrentBytes: 600, CurrentCount: 3, PeakBytes: 600, PeakCount: 3, TotalBytes: 600, TotalCount: 3}, st.Stats())

	closeBuf(t, b)
	assert.Equal(t, resource.Stats{CurrentBytes: 400, CurrentCount: 2, PeakBytes: 600, PeakCount: 3, TotalBytes: 600, TotalCount: 3}, st.Stats())

	d := allocOK(t, st, 50)
	assert.Equal(t, resource.Stats{CurrentBytes: 450, CurrentCount: 3, PeakBytes: 600, PeakCount: 3, TotalBytes: 650, TotalCount: 4}, st.Stats())

	st.ResetPeak()
	assert.Equal(t, resource.Stats{CurrentBytes: 450, CurrentCount: 3, PeakBytes: 450, PeakCount: 3, TotalBytes: 650, TotalCount: 4}, st.Stats())

	// Failures: the upstream's, counted and returned unchanged.
	fake.fail(2, 0)
	_, err := st.Allocate(1<<30, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.True(t, strings.HasPrefix(err.Error(), "fake.Allocate: "), err.Error())
	_, err = st.Allocate(1, nil)
	require.Error(t, err)

	// Size 0 owns nothing and is not counted.
	closeBuf(t, allocOK(t, st, 0))

	// A failed free changes nothing; the retry does.
	fake.fail(0, 1)
	require.Error(t, a.Close())
	assert.Equal(t, uint64(450), st.Stats().CurrentBytes)
	closeBuf(t, a)
	closeBuf(t, c)
	closeBuf(t, d)
	want := resource.Stats{PeakBytes: 450, PeakCount: 3, TotalBytes: 650, TotalCount: 4, Failures: 2}
	assert.Equal(t, want, st.Stats())
	assert.Equal(t, "current 0 bytes in 0 allocations, peak 450 bytes / 3 allocations, total 650 bytes in 4 allocations, 2 failures", want.String())

	// Forwarded frees of memory it never counted do not wrap below zero.
	direct, err := buffer.Allocate(fake, 64, nil)
	require.NoError(t, err)
	p, n, err := direct.Disown()
	require.NoError(t, err)
	require.NoError(t, st.Deallocate(p, n, nil))
	assert.Zero(t, st.Stats().CurrentBytes)
	assert.Zero(t, st.Stats().CurrentCount)
	fake.requireEmpty(t)
	assert.Contains(t, st.String(), "Statistics(0 bytes in 0 allocations, fake)")
}

func TestStatisticsConcurrent(t *testing.T) {
	checkBufferLeaks(t)
	const (
		workers = 16
		rounds  = 500
		held    = 4 // buffers each worker holds at most
	)
	fake := newRecording()
	st := resource.NewStatistics(fake)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var bufs []*buffer.Buffer
			for range rounds {
				b, err := st.Allocate(kib, nil)
				if !assert.NoError(t, err) {
					return
				}
				bufs = append(bufs, b)
				if len(bufs) == held {
					for _, b := range bufs {
						assert.NoError(t, b.Close())
					}
					bufs = bufs[:0]
				}
			}
			for _, b := range bufs {
				assert.NoError(t, b.Close())
			}
		}()
	}
	wg.Wait()
	s := st.Stats()
	assert.Zero(t, s.CurrentBytes)
	assert.Zero(t, s.CurrentCount)
	assert.Equal(t, uint64(workers*rounds), s.TotalCount)
	assert.Equal(t, uint64(workers*rounds*kib), s.TotalBytes)
	assert.LessOrEqual(t, s.PeakCount, uint64(workers*held))
	assert.GreaterOrEqual(t, s.PeakCount, uint64(held))
	// The two peaks are separate atomics (documented): with equal sizes
	// they agree to within one allocation per worker in flight.
	assert.InDelta(t, float64(s.PeakCount*kib), float64(s.PeakBytes), float64(workers*kib), "equal sizes: the peaks agree within the allocations in flight")
	fake.requireEmpty(t)
}

// --- Tracking ---

func TestTrackingLiveSet(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	tr := resource.NewTracking(fake, nil)
	assert.Nil(t, tr.Live())
	assert.Equal(t, "Tracking: no live allocations\n", tr.Report())

	s1, s2 := new(cuda.Stream), new(cuda.Stream) // opaque tokens: nothing here calls the driver
	before := time.Now()
	a, err := tr.Allocate(100, s1)
	require.NoError(t, err)
	b, err := tr.Allocate(200, s2)
	require.NoError(t, err)
	c := allocOK(t, tr, 300)
	after := time.Now()
	assert.Same(t, tr, a.Resource())

	live := tr.Live()
	require.Len(t, live, 3)
	for i := 1; i < len(live); i++ {
		assert.Less(t, live[i-1].Ptr, live[i].Ptr, "sorted by address")
	}
	byPtr := map[cuda.DevicePtr]resource.Allocation{}
	for _, l := range live {
		byPtr[l.Ptr] = l
		assert.False(t, l.Time.Before(before) || l.Time.After(after), "allocation time")
		assert.Nil(t, l.Callers, "no stacks unless asked")
		assert.Empty(t, l.Stack())
	}
	assert.Equal(t, uint64(100), byPtr[a.Ptr()].Size)
	assert.Same(t, s1, byPtr[a.Ptr()].Stream)
	assert.Same(t, s2, byPtr[b.Ptr()].Stream)
	assert.Equal(t, uint64(300), byPtr[c.Ptr()].Size)
	assert.Equal(t, uint64(600), tr.LiveBytes())
	assert.Equal(t, 3, tr.LiveCount())

	rep := tr.Report()
	assert.True(t, strings.HasPrefix(rep, "Tracking: 3 live allocations, 600 bytes, from 1 sites\n"), rep)
	assert.Contains(t, rep, "CaptureStacks is off")
	assert.Contains(t, rep, fmt.Sprintf("%#x: 200 bytes", uint64(b.Ptr())))

	// Closing frees on the allocation stream unless CloseOn names another.
	pb := b.Ptr()
	closeBuf(t, b)
	assert.Same(t, s2, fake.lastStream)
	require.NoError(t, a.CloseOn(s2))
	assert.Same(t, s2, fake.lastStream)
	live = tr.Live()
	require.Len(t, live, 1)
	assert.Equal(t, c.Ptr(), live[0].Ptr)
	assert.NotContains(t, tr.Report(), fmt.Sprintf("%#x", uint64(pb)))
	assert.Equal(t, uint64(300), tr.LiveBytes())

	closeBuf(t, allocOK(t, tr, 0)) // size 0: never live
	closeBuf(t, c)
	assert.Zero(t, tr.LiveCount())
	assert.Zero(t, tr.LiveBytes())
	assert.Nil(t, tr.Live())
	assert.Contains(t, tr.String(), "Tracking(0 live allocations, 0 bytes, fake)")
	fake.requireEmpty(t)
}

func TestTrackingDoubleFree(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	tr := resource.NewTracking(fake, nil)
	b := allocOK(t, tr, 1024)
	p := b.Ptr()

	// The wrong size is refused, and the allocation stays live.
	err := tr.Deallocate(p, 1000, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, fmt.Sprintf("Tracking.Deallocate: cuda: invalid argument: %#x freed with size 1000, allocated with 1024", uint64(p)), err.Error())
	assert.Equal(t, 1, tr.LiveCount())

	// Freed behind the buffer's back, then closed: the second free is
	// caught and never reaches the upstream.
	require.NoError(t, tr.Deallocate(p, 1024, nil))
	_, _, _, _, frees := fake.counts()
	assert.Equal(t, 1, frees)
	err = b.Close()
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), fmt.Sprintf("Tracking.Deallocate: cuda: invalid argument: %#x (1024 bytes) is not a live allocation of this resource", uint64(p)))
	_, _, _, _, frees = fake.counts()
	assert.Equal(t, 1, frees, "the double free was not forwarded")
	_, _, err = b.Disown() // the failed Close left it open: stop the safety net
	require.NoError(t, err)

	err = tr.Deallocate(0xdead_0000, 16, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.NoError(t, tr.Deallocate(0, 0, nil), "address 0 does nothing")

	// An upstream failure leaves the allocation live for a retry.
	c := allocOK(t, tr, 64)
	fake.fail(0, 1)
	require.ErrorIs(t, c.Close(), cuda.ErrorInvalidValue)
	assert.Equal(t, 1, tr.LiveCount())
	closeBuf(t, c)
	assert.Zero(t, tr.LiveCount())
	fake.requireEmpty(t)
}

// trackingSiteA and trackingSiteB are two allocation sites.
func trackingSiteA(t *testing.T, mr buffer.MemoryResource) *buffer.Buffer {
	return allocOK(t, mr, 1000)
}
func trackingSiteB(t *testing.T, mr buffer.MemoryResource) *buffer.Buffer { return allocOK(t, mr, 10) }

func TestTrackingStacks(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	tr := resource.NewTracking(fake, &resource.TrackingOptions{CaptureStacks: true})
	st := resource.NewStatistics(tr) // Tracking under another adaptor: its frames are dropped

	a := allocOK(t, st, 64)
	live := tr.Live()
	require.Len(t, live, 1)
	require.NotEmpty(t, live[0].Callers)
	stack := live[0].Stack()
	assert.Contains(t, stack, "resource_test.TestTrackingStacks")
	assert.Contains(t, stack, "adaptors_test.go:")
	assert.NotContains(t, stack, "(*Statistics)", "the adaptors' own frames are left out")
	assert.Contains(t, stack, "resource_test.allocOK", "the first frame is the caller of the adaptors")
	assert.True(t, strings.HasPrefix(stack, "github.com/cudamem/cudamem/resource_test.allocOK\n\t"), stack)
	closeBuf(t, a)

	// The report groups by site, largest first.
	var bufs []*buffer.Buffer
	for range 3 {
		bufs = append(bufs, trackingSiteA(t, tr))
	}
	bufs = append(bufs, trackingSiteB(t, tr))
	rep := tr.Report()
	assert.True(t, strings.HasPrefix(rep, "Tracking: 4 live allocations, 3010 bytes, from 2 sites\n"), rep)
	ia, ib := strings.Index(rep, "trackingSiteA"), strings.Index(rep, "trackingSiteB")
	require.Positive(t, ia, rep)
	require.Positive(t, ib, rep)
	assert.Less(t, ia, ib, "the larger site first")
	assert.Contains(t, rep, "\n3 allocations, 3000 bytes, allocated at:\n\tgithub.com/cudamem/cudamem/resource_test.allocOK\n")
	assert.Contains(t, rep, "\n1 allocations, 10 bytes, allocated at:\n")
	assert.Contains(t, rep, "TestTrackingStacks")
	assert.NotContains(t, rep, "runtime.goexit")
	for _, b := range bufs {
		closeBuf(t, b)
	}

	// Many allocations at one site: the first few are listed.
	bufs = bufs[:0]
	for range 12 {
		bufs = append(bufs, trackingSiteB(t, tr))
	}
	assert.Contains(t, tr.Report(), "\t... and 4 more\n")
	for _, b := range bufs {
		closeBuf(t, b)
	}
	assert.Zero(t, tr.LiveCount())
	fake.requireEmpty(t)
}

func TestTrackingConcurrent(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	tr := resource.NewTracking(fake, &resource.TrackingOptions{CaptureStacks: true})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				b, err := tr.Allocate(uint64(1+i%7)*64, nil)
				if !assert.NoError(t, err) {
					return
				}
				_ = tr.LiveBytes()
				assert.NoError(t, b.Close())
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, tr.LiveCount(), tr.Report())
	fake.requireEmpty(t)
}

// --- All three ---

// TestAdaptorsCompose: Tracking over Statistics over Limiting over the
// fake; every layer sees each allocation and each Close.
func TestAdaptorsCompose(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	lim := resource.NewLimiting(fake, 4*kib)
	st := resource.NewStatistics(lim)
	tr := resource.NewTracking(st, &resource.TrackingOptions{CaptureStacks: true})
	assert.Same(t, st, tr.Upstream())
	assert.Same(t, lim, st.Upstream())
	assert.Same(t, fake, lim.Upstream())

	a := allocOK(t, tr, 3*kib)
	assert.Same(t, tr, a.Resource())
	b := allocOK(t, tr, kib)
	assert.Equal(t, uint64(4*kib), lim.Used())
	assert.Equal(t, uint64(4*kib), st.Stats().CurrentBytes)
	assert.Equal(t, uint64(4*kib), tr.LiveBytes())
	live, bytes, _, _, _ := fake.counts()
	assert.Equal(t, 2, live)
	assert.Equal(t, uint64(4*kib), bytes)

	// The limit's refusal passes up unchanged and counts as a failure.
	_, err := tr.Allocate(1, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.True(t, strings.HasPrefix(err.Error(), "Limiting.Allocate: 1 bytes would exceed"), err.Error())
	assert.Equal(t, uint64(1), st.Stats().Failures)
	assert.Equal(t, 2, tr.LiveCount())

	closeBuf(t, a)
	assert.Equal(t, uint64(kib), lim.Used())
	assert.Equal(t, uint64(kib), st.Stats().CurrentBytes)
	assert.Equal(t, uint64(kib), tr.LiveBytes())

	// Size 0 passes through every layer and is counted by none.
	z := allocOK(t, tr, 0)
	assert.Same(t, tr, z.Resource())
	closeBuf(t, z)

	closeBuf(t, b)
	assert.Zero(t, lim.Used())
	assert.Equal(t, resource.Stats{PeakBytes: 4 * kib, PeakCount: 2, TotalBytes: 4 * kib, TotalCount: 2, Failures: 1}, st.Stats())
	assert.Zero(t, tr.LiveCount())
	_, _, _, allocs, frees := fake.counts()
	assert.Equal(t, 3, allocs) // two buffers and the empty one
	assert.Equal(t, 2, frees)
	fake.requireEmpty(t)
	assert.Equal(t, "Tracking(0 live allocations, 0 bytes, Statistics(0 bytes in 0 allocations, Limiting(0 of 4096 bytes used, fake)))", tr.String())
}

func TestAdaptorsForward(t *testing.T) {
	fake := newRecording()
	fake.hostAcc = true
	for _, mr := range []buffer.MemoryResource{
		resource.NewLimiting(fake, 1),
		resource.NewStatistics(fake),
		resource.NewTracking(fake, nil),
		resource.NewTracking(resource.NewStatistics(resource.NewLimiting(fake, 1)), nil),
	} {
		assert.True(t, mr.DeviceAccessible())
		assert.True(t, mr.HostAccessible())
		assert.Equal(t, 7, mr.DeviceID())
	}
}

// TestAdaptorsNil: nil receivers, zero values and nil upstreams give
// errors matching cuda.ErrInvalidArgument, never panics.
func TestAdaptorsNil(t *testing.T) {
	for _, tc := range []struct {
		name string
		mr   buffer.MemoryResource
		kind string
	}{
		{"nil Limiting", (*resource.Limiting)(nil), "Limiting"},
		{"zero Limiting", &resource.Limiting{}, "Limiting"},
		{"Limiting over nil", resource.NewLimiting(nil, 1<<20), "Limiting"},
		{"Limiting over a nil pointer", resource.NewLimiting((*resource.DevicePool)(nil), 1<<20), "Limiting"},
		{"nil Statistics", (*resource.Statistics)(nil), "Statistics"},
		{"zero Statistics", &resource.Statistics{}, "Statistics"},
		{"Statistics over nil", resource.NewStatistics(nil), "Statistics"},
		{"Statistics over a nil pointer", resource.NewStatistics((*resource.SyncDevice)(nil)), "Statistics"},
		{"nil Tracking", (*resource.Tracking)(nil), "Tracking"},
		{"zero Tracking", &resource.Tracking{}, "Tracking"},
		{"Tracking over nil", resource.NewTracking(nil, nil), "Tracking"},
		{"Tracking over a nil pointer", resource.NewTracking((*resource.Tracking)(nil), nil), "Tracking"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, size := range []uint64{0, 1024} {
				b, err := buffer.Allocate(tc.mr, size, nil)
				assert.Nil(t, b)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Contains(t, err.Error(), tc.kind+".Allocate")
			}
			assert.NoError(t, tc.mr.Deallocate(0, 0, nil), "freeing address 0 does nothing")
			err := tc.mr.Deallocate(0x1000, 64, nil)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.kind+".Deallocate")
			assert.False(t, tc.mr.DeviceAccessible())
			assert.False(t, tc.mr.HostAccessible())
			assert.Equal(t, -1, tc.mr.DeviceID())
			assert.NotEmpty(t, tc.mr.(fmt.Stringer).String())
		})
	}
	var lim *resource.Limiting
	assert.Zero(t, lim.Used())
	assert.Zero(t, lim.Limit())
	assert.Nil(t, lim.Upstream())
	var st *resource.Statistics
	assert.Equal(t, resource.Stats{}, st.Stats())
	st.ResetPeak()
	assert.Nil(t, st.Upstream())
	var tr *resource.Tracking
	assert.Nil(t, tr.Live())
	assert.Zero(t, tr.LiveBytes())
	assert.Zero(t, tr.LiveCount())
	assert.Equal(t, "Tracking: no live allocations\n", tr.Report())
	assert.Nil(t, tr.Upstream())
}

// TestAdaptorsOverZeroPools: pools build the adaptor's buffer themselves
// (no second Buffer); their errors pass up unchanged.
func TestAdaptorsOverZeroPools(t *testing.T) {
	for _, tc := range []struct {
		kind string
		pool buffer.MemoryResource
	}{{"DevicePool", &resource.DevicePool{}}, {"PinnedPool", &resource.PinnedPool{}}} {
		st := resource.NewStatistics(tc.pool)
		mr := resource.NewTracking(resource.NewLimiting(st, 1<<20), nil)
		b, err := mr.Allocate(64, nil)
		assert.Nil(t, b)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.True(t, strings.HasPrefix(err.Error(), tc.kind+".Allocate: "), err.Error())
		assert.Equal(t, uint64(1), st.Stats().Failures)
		assert.Zero(t, mr.LiveCount())
	}
}

// --- Benchmarks ---

// benchUpstream is the cheapest honest upstream: unique addresses from an
// atomic counter, and a Deallocate that does nothing.
type benchUpstream struct{ next atomic.Uint64 }

func (m *benchUpstream) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(m, size, s)
}

func (m *benchUpstream) AllocatePtr(_ uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return cuda.DevicePtr(m.next.Add(1 << 12)), s, nil
}
func (m *benchUpstream) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (m *benchUpstream) DeviceAccessible() bool                                { return true }
func (m *benchUpstream) HostAccessible() bool                                  { return false }
func (m *benchUpstream) DeviceID() int                                         { return 0 }

func all3(up buffer.MemoryResource) buffer.MemoryResource {
	return resource.NewTracking(resource.NewStatistics(resource.NewLimiting(up, 1<<40)), nil)
}

func subOver(tb testing.TB, up buffer.MemoryResource) buffer.MemoryResource {
	sa, err := resource.NewSubAllocatorNoDriver(up, nil)
	require.NoError(tb, err)
	tb.Cleanup(func() { assert.NoError(tb, sa.Close()) })
	return sa
}

// pairBytes is the heap bytes one allocate+close pair through mr costs,
// averaged over many pairs (Buffers come from slabs of 102, so
// testing.AllocsPerRun, which counts objects, cannot see them).
func pairBytes(t *testing.T, mr buffer.MemoryResource) float64 {
	const pairs = 64 * 200
	pair := func() {
		b, err := buffer.Allocate(mr, 256, nil)
		require.NoError(t, err)
		require.NoError(t, b.Close())
	}
	for range 64 * 4 {
		pair() // warm up: the sub-allocator's block, the tracking map
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range pairs {
		pair()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / pairs
}

// TestAdaptorStackOneBuffer: a stack of adaptors (over a SubAllocator,
// or a bare upstream) builds one Buffer per allocation, at the top: it
// allocates no more per pair than the bare upstream's own pair.
func TestAdaptorStackOneBuffer(t *testing.T) {
	checkBufferLeaks(t)
	bare := pairBytes(t, &benchUpstream{})
	require.Greater(t, bare, 32.0, "a Buffer is 40 bytes")
	for _, c := range []struct {
		name string
		mr   buffer.MemoryResource
	}{
		{"Limiting", resource.NewLimiting(&benchUpstream{}, 1<<40)},
		{"Statistics", resource.NewStatistics(&benchUpstream{})},
		{"Tracking", resource.NewTracking(&benchUpstream{}, nil)},
		{"Tracking(Statistics(Limiting))", all3(&benchUpstream{})},
		{"SubAllocator", subOver(t, &benchUpstream{})},
		{"Tracking(Statistics(Limiting(SubAllocator)))", all3(subOver(t, &benchUpstream{}))},
	} {
		got := pairBytes(t, c.mr)
		assert.Less(t, got, 1.25*bare, "%s: %.0f bytes per pair, the bare upstream %.0f: more than one Buffer", c.name, got, bare)
	}
}

// BenchmarkAdaptorPair measures an allocate+close pair through each
// adaptor over benchUpstream, next to the bare upstream pair (its own
// Allocate and Buffer.Close). An adaptor's difference is its own books:
// one Buffer per pair however deep the stack.
func BenchmarkAdaptorPair(b *testing.B) {
	cases := []struct {
		name string
		mr   func(b *testing.B) buffer.MemoryResource
	}{
		{"bare", func(*testing.B) buffer.MemoryResource { return &benchUpstream{} }},
		{"Limiting", func(*testing.B) buffer.MemoryResource { return resource.NewLimiting(&benchUpstream{}, 1<<40) }},
		{"Statistics", func(*testing.B) buffer.MemoryResource { return resource.NewStatistics(&benchUpstream{}) }},
		{"Tracking", func(*testing.B) buffer.MemoryResource { return resource.NewTracking(&benchUpstream{}, nil) }},
		{"TrackingStacks", func(*testing.B) buffer.MemoryResource {
			return resource.NewTracking(&benchUpstream{}, &resource.TrackingOptions{CaptureStacks: true})
		}},
		{"all3", func(*testing.B) buffer.MemoryResource { return all3(&benchUpstream{}) }},
		{"x2/Limiting", func(*testing.B) buffer.MemoryResource {
			return resource.NewLimiting(resource.NewLimiting(&benchUpstream{}, 1<<40), 1<<40)
		}},
		{"x2/Statistics", func(*testing.B) buffer.MemoryResource {
			return resource.NewStatistics(resource.NewStatistics(&benchUpstream{}))
		}},
		{"x2/Tracking", func(*testing.B) buffer.MemoryResource {
			return resource.NewTracking(resource.NewTracking(&benchUpstream{}, nil), nil)
		}},
		// Over a SubAllocator: SubAllocator is its pair alone.
		{"SubAllocator", func(b *testing.B) buffer.MemoryResource { return subOver(b, &benchUpstream{}) }},
		{"SubAllocator/Limiting", func(b *testing.B) buffer.MemoryResource {
			return resource.NewLimiting(subOver(b, &benchUpstream{}), 1<<40)
		}},
		{"SubAllocator/Statistics", func(b *testing.B) buffer.MemoryResource {
			return resource.NewStatistics(subOver(b, &benchUpstream{}))
		}},
		{"SubAllocator/Tracking", func(b *testing.B) buffer.MemoryResource {
			return resource.NewTracking(subOver(b, &benchUpstream{}), nil)
		}},
		{"SubAllocator/all3", func(b *testing.B) buffer.MemoryResource { return all3(subOver(b, &benchUpstream{})) }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			mr := c.mr(b)
			b.ReportAllocs()
			for b.Loop() {
				buf, err := buffer.Allocate(mr, 256, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := buf.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, c := range cases {
		b.Run("parallel/"+c.name, func(b *testing.B) {
			mr := c.mr(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					buf, err := buffer.Allocate(mr, 256, nil)
					if err != nil {
						b.Error(err)
						return
					}
					if err := buf.Close(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// --- Examples (they need a GPU, so they have no Output) ---

// A budget for one component sharing a device: at most 1 GiB through
// this resource, whatever the pool could give.
func ExampleNewLimiting() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	mr := resource.NewLimiting(pool, 1<<30)
	buf, err := mr.Allocate(2<<30, nil)
	if err != nil {
		fmt.Println(err) // matches cuda.ErrorOutOfMemory; the pool was not asked
		return
	}
	defer buf.Close()
}

// How much memory a phase of a program needs at its worst.
func ExampleNewStatistics() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	mr := resource.NewStatistics(pool)
	mr.ResetPeak()
	for range 3 {
		buf, err := mr.Allocate(64<<20, nil)
		if err != nil {
			log.Fatal(err)
		}
		// ... use buf ...
		defer buf.Close()
	}
	fmt.Printf("peak %d bytes\n", mr.Stats().PeakBytes)
}

// In a test: allocate through a Tracking and, at the end, print where any
// leaked buffer was allocated.
func ExampleNewTracking() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	mr := resource.NewTracking(pool, &resource.TrackingOptions{CaptureStacks: true})
	defer func() {
		if mr.LiveCount() != 0 {
			log.Fatal(mr.Report()) // sites and stacks of what was not closed
		}
	}()
	buf, err := mr.Allocate(1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	buf.Close()
}

// Adaptors stack: a capped, counted, tracked pool.
func ExampleNewTracking_compose() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	stats := resource.NewStatistics(resource.NewLimiting(pool, 8<<30))
	mr := resource.NewTracking(stats, nil)
	buf, err := mr.Allocate(1<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	buf.Close() // frees through Tracking, Statistics and Limiting, then the pool
	fmt.Println(stats.Stats())
}

// partlyFreeing is an upstream whose frees release the memory but report
// an error wrapping buffer.ErrPartlyFreed (a free that got the memory back
// but failed a later step).
type partlyFreeing struct{ *recordingResource }

func (p partlyFreeing) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if err := p.recordingResource.Deallocate(ptr, size, s); err != nil {
		return err
	}
	return fmt.Errorf("fake.Deallocate: %w", buffer.ErrPartlyFreed)
}

// TestAdaptorsBooksOnPartlyFreed: a free that reports the memory gone
// (buffer.ErrPartlyFreed) takes it off each adaptor's books, and a free
// that failed otherwise keeps it there, for a retried Close.
func TestAdaptorsBooksOnPartlyFreed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wrap  func(up buffer.MemoryResource) buffer.MemoryResource
		books func(mr buffer.MemoryResource) uint64 // bytes the adaptor counts live
	}{
		{"Limiting", func(up buffer.MemoryResource) buffer.MemoryResource { return resource.NewLimiting(up, 1<<20) },
			func(mr buffer.MemoryResource) uint64 { return mr.(*resource.Limiting).Used() }},
		{"Statistics", func(up buffer.MemoryResource) buffer.MemoryResource { return resource.NewStatistics(up) },
			func(mr buffer.MemoryResource) uint64 { return mr.(*resource.Statistics).Stats().CurrentBytes }},
		{"Tracking", func(up buffer.MemoryResource) buffer.MemoryResource { return resource.NewTracking(up, nil) },
			func(mr buffer.MemoryResource) uint64 { return mr.(*resource.Tracking).LiveBytes() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecording()
			mr := tc.wrap(partlyFreeing{rec})
			b := allocOK(t, mr, 4096)
			require.Equal(t, uint64(4096), tc.books(mr))
			require.ErrorIs(t, b.Close(), buffer.ErrPartlyFreed)
			assert.Zero(t, tc.books(mr), "the memory is gone: off the books")
			rec.requireEmpty(t)

			mr = tc.wrap(rec)
			b = allocOK(t, mr, 4096)
			rec.fail(0, 1)
			require.ErrorIs(t, b.Close(), cuda.ErrorInvalidValue)
			assert.Equal(t, uint64(4096), tc.books(mr), "the memory is still held: still on the books")
			require.NoError(t, b.Close(), "a retried Close frees it")
			assert.Zero(t, tc.books(mr))
			rec.requireEmpty(t)
		})
	}
}
