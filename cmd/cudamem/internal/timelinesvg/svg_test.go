package timelinesvg_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cmd/cudamem/internal/timelinesvg"
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

// svgDoc is what the tests read back from a picture.
type svgDoc struct {
	bands    []map[string]string // attributes of each band path
	others   int
	panels   []map[string]string
	segments []map[string]string
	root     map[string]string
	legend   []string // the kinds of the legend's entries
	ticks    []string // the values of the time axis's ticks, panel after panel
	labels   []string // their labels
}

// parseSVG decodes the picture with encoding/xml (so it is well-formed
// XML) and collects the elements the checks need.
func parseSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	dec := xml.NewDecoder(bytes.NewReader(data))
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG must be well-formed XML")
		switch el := tok.(type) {
		case xml.StartElement:
			depth++
			attrs := map[string]string{}
			for _, a := range el.Attr {
				attrs[strings.TrimPrefix(a.Name.Local, "data-")] = a.Value
			}
			if depth == 1 {
				require.Equal(t, "svg", el.Name.Local)
				require.Equal(t, "http://www.w3.org/2000/svg", el.Name.Space)
				doc.root = attrs
			}
			switch attrs["class"] {
			case "band":
				doc.bands = append(doc.bands, attrs)
			case "other":
				doc.others++
			case "panel":
				doc.panels = append(doc.panels, attrs)
			case "segment":
				doc.segments = append(doc.segments, attrs)
			case "legend-entry":
				doc.legend = append(doc.legend, attrs["kind"])
			case "tick":
				doc.ticks = append(doc.ticks, attrs["value"])
				var label string
				require.NoError(t, dec.DecodeElement(&label, &el))
				doc.labels = append(doc.labels, label)
				depth--
			}
		case xml.EndElement:
			depth--
		}
	}
	require.Zero(t, depth)
	return doc
}

// The picture says what its marks mean, and its time axis starts at the
// first event with round ticks: it started at the Log's clock origin
// (12.41 ms of nothing before the first event here) with ticks at fifths
// of the span (3.55 ms, 7.10 ms, ...), and had no legend.
func TestSVGLegendAndAxis(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	tr := &timeline.Trace{Version: timeline.TraceVersion}
	var seq uint64
	add := func(at float64, k timeline.Kind, addr, size uint64) {
		seq++
		tr.Events = append(tr.Events, timeline.Event{Seq: seq, Time: ms(at), Kind: k, Addr: addr, Size: size, Resource: "pool"})
	}
	add(12.41, timeline.Alloc, 0x1000, 1<<20)
	for i := range 20 {
		add(13+float64(i)*0.2, timeline.Alloc, 0x200000+uint64(i)<<12, uint64(i+1)*256)
	}
	add(17.76, timeline.Free, 0x1000, 1<<20)

	var out bytes.Buffer
	require.NoError(t, timelinesvg.Write(&out, tr, &timelinesvg.Options{MaxBands: 5}))
	doc := parseSVG(t, out.Bytes())
	assert.Equal(t, []string{"allocation", "other", "free"}, doc.legend, "allocations, the grey band of the smaller ones, free ranges")
	assert.Equal(t, []string{"0", "500000", "1000000", "1500000", "2000000", "2500000", "3000000", "3500000", "4000000", "4500000", "5000000"},
		doc.ticks, "ticks every half millisecond from the first event")
	assert.Equal(t, []string{"0.0 ms", "0.5 ms", "1.0 ms", "1.5 ms", "2.0 ms", "2.5 ms", "3.0 ms", "3.5 ms", "4.0 ms", "4.5 ms", "5.0 ms"}, doc.labels)
	assert.True(t, strings.Contains(out.String(), "time since the first event"), "time since the first event")
	assert.True(t, strings.Contains(out.String(), "times are from the first event, 12.41 ms after the log started"), "times are from the first event, 12.41 ms after the log started")
	assert.True(t, strings.Contains(out.String(), "peak 1.1 MiB at 4.39 ms (event 21)"), "times from the first event")
	assert.True(t, strings.Contains(out.String(), "allocated at 0 ns (event 1)"), "allocated at 0 ns (event 1)")
	for _, b := range doc.bands {
		if b["alloc-seq"] == "1" {
			assert.True(t, strings.HasPrefix(b["d"], "M80.00 "), "the first event's band starts at the axis's start: %s", b["d"])
		}
	}

	// Without smaller allocations drawn together or free ranges, the
	// legend has only what is drawn.
	out.Reset()
	require.NoError(t, timelinesvg.Write(&out, tr, &timelinesvg.Options{SegmentsAt: 1}))
	assert.Equal(t, []string{"allocation"}, parseSVG(t, out.Bytes()).legend)
}

func num(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 0, 64)
	require.NoError(t, err, s)
	return v
}

// TestSVGNumbers: the picture has one band per allocation, and the bands
// live at each event add up to what Statistics reported then.
func TestSVGNumbers(t *testing.T) {
	log := timeline.NewLog(0)
	rec := timeline.NewRecorder(newFake(), log, &timeline.RecorderOptions{Name: "pool <&> \"x\"", CaptureStacks: true})
	stats := resource.NewStatistics(rec)
	want := map[uint64]uint64{} // event seq -> bytes live after it
	var held []*buffer.Buffer
	step := func() { want[uint64(len(want)+1)] = stats.Stats().CurrentBytes }
	for i := range 120 {
		held = append(held, alloc(t, stats, uint64(1+(i*7919)%50000)))
		step()
		if i%3 != 0 {
			j := (i * 31) % len(held)
			require.NoError(t, held[j].Close())
			held = append(held[:j], held[j+1:]...)
			step()
		}
	}
	tr := log.Trace()
	require.Len(t, tr.Events, len(want))
	for _, byEvent := range []bool{false, true} {
		var out bytes.Buffer
		require.NoError(t, timelinesvg.Write(&out, tr, &timelinesvg.Options{ByEvent: byEvent, Title: "test <1>"}))
		doc := parseSVG(t, out.Bytes())
		require.Len(t, doc.panels, 1)
		assert.Equal(t, "pool <&> \"x\"", doc.panels[0]["resource"])
		allocs := tr.Allocations()
		require.Len(t, doc.bands, len(allocs), "one band per allocation")
		assert.Equal(t, strconv.Itoa(len(allocs)), doc.panels[0]["bands"])
		assert.Zero(t, doc.others)
		var peak uint64
		for seq, bytesLive := range want {
			var sum uint64
			for _, b := range doc.bands {
				a, f := num(t, b["alloc-seq"]), num(t, b["free-seq"])
				if a <= seq && (f == 0 || f > seq) {
					sum += num(t, b["size"])
				}
			}
			require.Equal(t, bytesLive, sum, "bytes live after event %d", seq)
			peak = max(peak, bytesLive)
		}
		assert.Equal(t, strconv.FormatUint(peak, 10), doc.panels[0]["peak"])
		assert.Equal(t, stats.Stats().PeakBytes, peak)
	}
	for _, b := range held {
		require.NoError(t, b.Close())
	}
}

// TestSVGBandsCapped: beyond MaxBands the smallest allocations become one
// grey band.
func TestSVGBandsCapped(t *testing.T) {
	rec := timeline.NewRecorder(newFake(), nil, &timeline.RecorderOptions{Name: "r"})
	for i := range 50 {
		require.NoError(t, alloc(t, rec, uint64(i+1)*100).Close())
	}
	var out bytes.Buffer
	require.NoError(t, timelinesvg.Write(&out, rec.Log().Trace(), &timelinesvg.Options{MaxBands: 10}))
	doc := parseSVG(t, out.Bytes())
	require.Len(t, doc.bands, 10)
	assert.Equal(t, 1, doc.others)
	for _, b := range doc.bands {
		assert.GreaterOrEqual(t, num(t, b["size"]), uint64(4100), "the largest are drawn on their own")
	}
}

// TestSVGSegments: Recorders below and above a SubAllocator; the segment
// view at a chosen moment shows the sub-allocator's blocks.
func TestSVGSegments(t *testing.T) {
	log := timeline.NewLog(0)
	sa, err := resource.NewSubAllocator(timeline.NewRecorder(newFake(), log, &timeline.RecorderOptions{Name: "blocks"}),
		&resource.SubAllocatorOptions{GrowSize: 128 << 10})
	require.NoError(t, err)
	mr := timeline.NewRecorder(sa, log, &timeline.RecorderOptions{Name: "sub"})
	var held []*buffer.Buffer
	for i := range 60 {
		held = append(held, alloc(t, mr, uint64(1+(i*4099)%30000)))
		if i%4 == 1 {
			require.NoError(t, held[i/2].Close())
		}
	}
	st := sa.Stats()
	tr := log.Trace()
	at := tr.Events[len(tr.Events)-1].Seq
	for i := range 10 { // later events do not change the view at `at`
		require.NoError(t, held[len(held)-1-i].Close())
	}
	tr = log.Trace()
	var out bytes.Buffer
	require.NoError(t, timelinesvg.Write(&out, tr, &timelinesvg.Options{SegmentsAt: at}))
	doc := parseSVG(t, out.Bytes())
	require.Len(t, doc.panels, 2)
	require.Len(t, doc.segments, st.Blocks)
	var reserved, used, free, ranges uint64
	for _, s := range doc.segments {
		assert.Equal(t, "blocks", s["resource"])
		assert.Equal(t, "false", s["inferred"])
		reserved += num(t, s["size"])
		used += num(t, s["used"])
		free += num(t, s["free"])
		ranges += num(t, s["free-ranges"])
	}
	assert.Equal(t, st.Reserved, reserved)
	assert.Equal(t, st.Used, used)
	assert.Equal(t, st.Free, free)
	assert.Equal(t, uint64(st.FreeRanges), ranges)

	require.ErrorIs(t, timelinesvg.Write(&out, tr, &timelinesvg.Options{SegmentsAt: 1 << 40}), cuda.ErrInvalidArgument)
	for _, b := range held {
		require.NoError(t, b.Close())
	}
}

func TestSVGEmpty(t *testing.T) {
	for _, tr := range []*timeline.Trace{nil, {}, timeline.NewLog(1).Trace()} {
		var out bytes.Buffer
		require.NoError(t, timelinesvg.Write(&out, tr, nil))
		doc := parseSVG(t, out.Bytes())
		assert.Empty(t, doc.bands)
		assert.Empty(t, doc.segments)
	}
	require.ErrorIs(t, timelinesvg.Write(nil, &timeline.Trace{}, nil), cuda.ErrInvalidArgument)
}

// FuzzWrite: whatever trace ReadJSON accepts draws as well-formed XML.
func FuzzWrite(f *testing.F) {
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
		var out bytes.Buffer
		require.NoError(t, timelinesvg.Write(&out, tr, &timelinesvg.Options{MaxBands: 50}))
		parseSVG(t, out.Bytes())
	})
}
