package timeline_test

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/timeline"
)

// fake is an upstream with made-up addresses, books of what is live and
// switches to make calls fail.
type fake struct {
	mu         sync.Mutex
	next       cuda.DevicePtr
	live       map[cuda.DevicePtr]uint64
	failAllocs int
	failFrees  int
}

func newFake() *fake { return &fake{next: 0x7f0000000000, live: map[cuda.DevicePtr]uint64{}} }

func (f *fake) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAllocs > 0 {
		f.failAllocs--
		return 0, nil, &cuda.OpError{Op: "fake.Allocate", Err: cuda.ErrorOutOfMemory}
	}
	if size == 0 {
		return 0, s, nil
	}
	p := f.next
	f.next += cuda.DevicePtr((size + 255) &^ 255)
	f.live[p] = size
	return p, s, nil
}

func (f *fake) Deallocate(p cuda.DevicePtr, size uint64, _ *cuda.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failFrees > 0 {
		f.failFrees--
		return &cuda.OpError{Op: "fake.Deallocate", Err: cuda.ErrorInvalidValue}
	}
	if f.live[p] != size {
		return cuda.Errorf("fake.Deallocate", cuda.ErrInvalidArgument, "%#x not live", uint64(p))
	}
	delete(f.live, p)
	return nil
}
func (f *fake) DeviceAccessible() bool { return true }
func (f *fake) HostAccessible() bool   { return false }
func (f *fake) DeviceID() int          { return 5 }
func (f *fake) String() string         { return "fake" }

func alloc(t *testing.T, mr buffer.MemoryResource, n uint64) *buffer.Buffer {
	t.Helper()
	b, err := buffer.Allocate(mr, n, nil)
	require.NoError(t, err)
	return b
}

func TestRecorderEvents(t *testing.T) {
	up := newFake()
	rec := timeline.NewRecorder(up, nil, &timeline.RecorderOptions{Name: "r"})
	require.NotNil(t, rec.Log(), "a nil log gets a new one")
	assert.Equal(t, "r", rec.Name())
	assert.Equal(t, 5, rec.DeviceID())
	assert.True(t, rec.DeviceAccessible())
	assert.False(t, rec.HostAccessible())
	assert.Same(t, up, rec.Upstream())
	assert.Equal(t, "*timeline_test.fake", timeline.NewRecorder(up, nil, nil).Name(), "no name: the upstream's type")

	a := alloc(t, rec, 1000)
	ptr := a.Ptr()
	assert.Same(t, rec, a.Resource(), "the recorder owns its buffers")
	empty := alloc(t, rec, 0)
	require.NoError(t, empty.Close())
	up.failAllocs = 1
	_, err := rec.Allocate(10, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	up.failFrees = 1
	require.ErrorIs(t, a.Close(), cuda.ErrorInvalidValue)
	require.NoError(t, a.Close())
	assert.Contains(t, rec.String(), `Recorder("r", 4 events, fake)`)

	tr := rec.Log().Trace()
	require.Len(t, tr.Events, 4, "alloc, free (failed), alloc again, free; nothing for size 0 or a failure")
	kinds := []timeline.Kind{timeline.Alloc, timeline.Free, timeline.Alloc, timeline.Free}
	for i, e := range tr.Events {
		assert.Equal(t, kinds[i], e.Kind, i)
		assert.Equal(t, uint64(i+1), e.Seq)
		assert.Equal(t, uint64(ptr), e.Addr)
		assert.Equal(t, uint64(1000), e.Size)
		assert.Equal(t, 5, e.Device)
		assert.Equal(t, "r", e.Resource)
		assert.Zero(t, e.Stream)
		assert.Empty(t, e.Stack)
		if i > 0 {
			assert.GreaterOrEqual(t, e.Time, tr.Events[i-1].Time)
		}
	}
	u := tr.Usage("r")
	require.Len(t, u, 5)
	assert.Equal(t, []uint64{0, 1000, 0, 1000, 0}, []uint64{u[0].Bytes, u[1].Bytes, u[2].Bytes, u[3].Bytes, u[4].Bytes})
	assert.Empty(t, up.live)
}

func TestRecorderStacks(t *testing.T) {
	rec := timeline.NewRecorder(newFake(), nil, &timeline.RecorderOptions{CaptureStacks: true})
	mr := resource.NewStatistics(rec) // the adaptors' frames are left out too
	b := alloc(t, mr, 64)
	require.NoError(t, b.Close())
	tr := rec.Log().Trace()
	require.Len(t, tr.Events, 2)
	for _, e := range tr.Events {
		require.NotEmpty(t, e.Stack)
		assert.True(t, strings.HasPrefix(e.Stack[0], "github.com/cudamem/cudamem/resource/timeline_test."), "first frame is the caller: %q", e.Stack[0])
		assert.Contains(t, e.Stack[0], "timeline_test.go:")
	}
	assert.Contains(t, tr.Events[0].Stack[0], "timeline_test.alloc")
	assert.Contains(t, tr.Events[1].Stack[0], "TestRecorderStacks")
}

func TestRecorderErrors(t *testing.T) {
	for name, r := range map[string]*timeline.Recorder{
		"nil upstream":       timeline.NewRecorder(nil, nil, nil),
		"typed nil upstream": timeline.NewRecorder((*resource.Statistics)(nil), nil, nil),
		"zero":               {},
		"nil":                nil,
	} {
		_, err := r.Allocate(1, nil)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		assert.ErrorIs(t, r.Deallocate(0x1000, 1, nil), cuda.ErrInvalidArgument, name)
		assert.NoError(t, r.Deallocate(0, 1, nil), name)
		assert.Equal(t, -1, r.DeviceID())
	}
}

// TestRing: a full Log drops the oldest events and counts them; Reset
// empties it.
func TestRing(t *testing.T) {
	log := timeline.NewLog(8)
	assert.Equal(t, 8, log.Capacity())
	rec := timeline.NewRecorder(newFake(), log, nil)
	var keep []*buffer.Buffer
	for i := range 10 {
		b := alloc(t, rec, uint64(100+i))
		if i < 2 {
			keep = append(keep, b) // live across the drops
			continue
		}
		require.NoError(t, b.Close())
	}
	assert.Equal(t, 8, log.Len())
	assert.Equal(t, uint64(10), log.Dropped(), "18 events, 8 kept")
	tr := log.Trace()
	assert.Equal(t, uint64(11), tr.Events[0].Seq)
	require.Len(t, tr.Before, 2, "the two live allocations whose Alloc events were dropped")
	assert.Equal(t, uint64(100), tr.Before[0].Size)
	assert.Equal(t, uint64(101), tr.Before[1].Size)
	assert.Equal(t, uint64(201), tr.TotalUsage()[0].Bytes)
	for _, b := range keep {
		require.NoError(t, b.Close())
	}
	assert.Equal(t, uint64(0), log.Trace().TotalUsage()[8].Bytes)
	log.Reset()
	assert.Zero(t, log.Len())
	assert.Zero(t, log.Dropped())
	assert.Empty(t, log.Trace().Events)

	var zero timeline.Log // usable: DefaultCapacity, clock from the first event
	assert.Equal(t, timeline.DefaultCapacity, zero.Capacity())
	b := alloc(t, timeline.NewRecorder(newFake(), &zero, nil), 1)
	require.NoError(t, b.Close())
	assert.Equal(t, 2, zero.Len())
}

func TestJSONRoundTrip(t *testing.T) {
	log := timeline.NewLog(16)
	rec := timeline.NewRecorder(newFake(), log, &timeline.RecorderOptions{Name: `a "quoted" name`, CaptureStacks: true})
	keep := alloc(t, rec, 7)
	for i := range 20 {
		require.NoError(t, alloc(t, rec, uint64(i+1)).Close())
	}
	tr := log.Trace()
	require.NotEmpty(t, tr.Before)
	var buf bytes.Buffer
	require.NoError(t, tr.WriteJSON(&buf))
	back, err := timeline.ReadJSON(&buf)
	require.NoError(t, err)
	assert.True(t, tr.Start.Equal(back.Start))
	back.Start = tr.Start
	assert.Equal(t, tr, back)
	require.NoError(t, keep.Close())

	// An empty trace round-trips too, with "events": [].
	buf.Reset()
	require.NoError(t, (*timeline.Trace)(nil).WriteJSON(&buf))
	assert.Contains(t, buf.String(), `"events":[]`)
	back, err = timeline.ReadJSON(&buf)
	require.NoError(t, err)
	assert.Empty(t, back.Events)
}

func TestReadJSONRejects(t *testing.T) {
	for name, in := range map[string]string{
		"garbage":        "not json",
		"empty":          "",
		"version":        `{"version": 2, "events": []}`,
		"no version":     `{"events": []}`,
		"unknown field":  `{"version": 1, "events": [], "extra": 1}`,
		"unknown kind":   `{"version": 1, "events": [{"seq": 1, "kind": "move"}]}`,
		"no kind":        `{"version": 1, "events": [{"seq": 1}]}`,
		"seq back":       `{"version": 1, "events": [{"seq": 2, "kind": "alloc"}, {"seq": 2, "kind": "free"}]}`,
		"time back":      `{"version": 1, "events": [{"seq": 1, "t_ns": 5, "kind": "alloc"}, {"seq": 2, "t_ns": 4, "kind": "free"}]}`,
		"negative time":  `{"version": 1, "events": [{"seq": 1, "t_ns": -5, "kind": "alloc"}]}`,
		"free in before": `{"version": 1, "before": [{"seq": 1, "kind": "free"}], "events": []}`,
		"negative size":  `{"version": 1, "events": [{"seq": 1, "kind": "alloc", "size": -1}]}`,
	} {
		_, err := timeline.ReadJSON(strings.NewReader(in))
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
	}
	_, err := timeline.ReadJSON(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// TestConcurrent: goroutines allocating and freeing through one Recorder
// (run with -race); the trace balances at the end.
func TestConcurrent(t *testing.T) {
	log := timeline.NewLog(1 << 10)
	rec := timeline.NewRecorder(newFake(), log, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 400 {
				b, err := rec.Allocate(uint64(g*1000+i+1), nil)
				if assert.NoError(t, err) {
					assert.NoError(t, b.Close())
				}
			}
		}()
	}
	for range 20 {
		_ = log.Trace()
	}
	wg.Wait()
	tr := log.Trace()
	assert.Equal(t, uint64(3200-1024), tr.Dropped)
	u := tr.TotalUsage()
	assert.Zero(t, u[len(u)-1].Bytes)
	// Allocations made before the window are carried only while their
	// Free is in it.
	for _, b := range tr.Before {
		assert.True(t, slices.ContainsFunc(tr.Events, func(e timeline.Event) bool {
			return e.Kind == timeline.Free && e.Addr == b.Addr && e.Seq > b.Seq
		}), "carried allocation %+v has its free in the window", b)
	}
}

// FuzzReadJSON: any input either fails to read or reads into a trace
// that writes back and reads again (cmd/cudamem's SVG writer has a fuzz
// test of its own that draws what ReadJSON accepts).
func FuzzReadJSON(f *testing.F) {
	f.Add([]byte(`{"version":1,"events":[{"seq":1,"t_ns":0,"kind":"alloc","addr":4096,"size":100,"resource":"a"},{"seq":2,"t_ns":5,"kind":"free","addr":4096,"size":100,"resource":"a"}]}`))
	f.Add([]byte(`{"version":1,"before":[{"seq":1,"kind":"alloc","addr":4096,"size":1048576,"resource":"blocks"}],"events":[{"seq":3,"kind":"alloc","addr":8192,"size":100,"resource":"sub"},{"seq":4,"kind":"alloc","addr":8192,"size":18446744073709551615,"resource":"sub"}]}`))
	f.Add([]byte(`{"version":1,"events":[{"seq":1,"kind":"free","addr":1,"size":1,"resource":"<\u0000>"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := timeline.ReadJSON(bytes.NewReader(data))
		if err != nil {
			return
		}
		if len(tr.Events)+len(tr.Before) > 2000 {
			return // keep each run short
		}
		var js bytes.Buffer
		require.NoError(t, tr.WriteJSON(&js))
		_, err = timeline.ReadJSON(&js)
		require.NoError(t, err)
	})
}

// nop is an upstream that does nothing but hand out one address.
type nop struct{}

func (nop) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0x10000, s, nil
}
func (nop) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (nop) DeviceAccessible() bool                                { return true }
func (nop) HostAccessible() bool                                  { return false }
func (nop) DeviceID() int                                         { return 0 }

// BenchmarkRecorderPair: an allocate+free pair through the bare upstream
// and through a Recorder over it, without and with stacks.
func BenchmarkRecorderPair(b *testing.B) {
	pair := func(b *testing.B, mr buffer.MemoryResource) {
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
	}
	b.Run("bare", func(b *testing.B) { pair(b, nop{}) })
	b.Run("recorder", func(b *testing.B) { pair(b, timeline.NewRecorder(nop{}, timeline.NewLog(1<<12), nil)) })
	b.Run("recorder+stacks", func(b *testing.B) {
		pair(b, timeline.NewRecorder(nop{}, timeline.NewLog(1<<12), &timeline.RecorderOptions{CaptureStacks: true}))
	})
}

// A free the upstream refuses as not its allocation (a double free)
// records no allocation that does not exist (found in review).
func TestRecorderRefusedDoubleFree(t *testing.T) {
	st := resource.NewStatistics(newFake())
	r := timeline.NewRecorder(st, nil, &timeline.RecorderOptions{Name: "r"})
	b, err := r.Allocate(1024, nil)
	require.NoError(t, err)
	p := b.Ptr()
	require.NoError(t, b.Close())
	require.Error(t, r.Deallocate(p, 1024, nil))
	u := r.Log().Trace().Usage("r")
	require.NotEmpty(t, u)
	assert.Equal(t, st.Stats().CurrentCount, u[len(u)-1].Count)
}
