package timeline_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource/timeline"
)

// readChrome decodes a Chrome trace and checks every event against the
// format's required fields: name, ph, ts, pid and tid (tid may be left
// out of process-wide events: counters and process metadata), a known
// phase, dur on complete events, and args with numbers on counters.
func readChrome(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.NotNil(t, doc.TraceEvents, "traceEvents missing")
	for i, e := range doc.TraceEvents {
		for _, k := range []string{"name", "ph", "ts", "pid", "tid"} {
			require.Contains(t, e, k, "event %d: %v", i, e)
		}
		name, ok := e["name"].(string)
		require.True(t, ok && name != "", "event %d: name %v", i, e["name"])
		for _, k := range []string{"ts", "pid", "tid"} {
			_, ok := e[k].(float64)
			require.True(t, ok, "event %d: %s is not a number: %v", i, k, e[k])
		}
		switch e["ph"] {
		case "X":
			d, ok := e["dur"].(float64)
			require.True(t, ok && d >= 0, "event %d: dur %v", i, e["dur"])
		case "C":
			args, ok := e["args"].(map[string]any)
			require.True(t, ok && len(args) > 0, "event %d: counter without args", i)
			for k, v := range args {
				_, ok := v.(float64)
				require.True(t, ok, "event %d: counter arg %s=%v is not a number", i, k, v)
			}
		case "M":
			args, ok := e["args"].(map[string]any)
			require.True(t, ok && args["name"] != nil, "event %d: metadata without a name", i)
		default:
			t.Fatalf("event %d: unexpected phase %v", i, e["ph"])
		}
	}
	return doc.TraceEvents
}

func TestChromeTrace(t *testing.T) {
	log := timeline.NewLog(0)
	rec := timeline.NewRecorder(newFake(), log, &timeline.RecorderOptions{Name: "pool", CaptureStacks: true})
	a := alloc(t, rec, 100)
	b := alloc(t, rec, 200)
	require.NoError(t, a.Close())
	c := alloc(t, rec, 300)
	require.NoError(t, b.Close())

	var buf bytes.Buffer
	require.NoError(t, log.Trace().WriteChromeTrace(&buf))
	evs := readChrome(t, buf.Bytes())

	var spans, counters []map[string]any
	for _, e := range evs {
		switch e["ph"] {
		case "X":
			spans = append(spans, e)
		case "C":
			counters = append(counters, e)
		}
	}
	require.Len(t, spans, 3)
	sizes := []float64{}
	for _, s := range spans {
		args := s["args"].(map[string]any)
		sizes = append(sizes, args["size"].(float64))
		assert.Equal(t, "pool", args["resource"])
		assert.NotEmpty(t, args["stack"])
		assert.Equal(t, float64(7), s["pid"], "device 5's process")
	}
	assert.ElementsMatch(t, []float64{100, 200, 300}, sizes)
	// The start, then one counter per event: 100, 300, 200, 500, 300.
	var bytesSeen []float64
	for _, c := range counters {
		assert.Equal(t, "pool", c["name"])
		bytesSeen = append(bytesSeen, c["args"].(map[string]any)["bytes"].(float64))
	}
	assert.Equal(t, []float64{0, 100, 300, 200, 500, 300}, bytesSeen)
	// Times do not go back.
	var last float64 = -1
	for _, e := range evs {
		if e["ph"] == "M" {
			continue
		}
		ts := e["ts"].(float64)
		assert.GreaterOrEqual(t, ts, last)
		last = ts
	}
	require.NoError(t, c.Close())
}

func TestChromeTraceEmptyAndErrors(t *testing.T) {
	for _, tr := range []*timeline.Trace{nil, {}, timeline.NewLog(1).Trace()} {
		var buf bytes.Buffer
		require.NoError(t, tr.WriteChromeTrace(&buf))
		assert.Contains(t, buf.String(), `"traceEvents":[]`)
		readChrome(t, buf.Bytes())
	}
	err := (&timeline.Trace{}).WriteChromeTrace(nil)
	assert.True(t, errors.Is(err, cuda.ErrInvalidArgument), "%v", err)
}

// Each resource's counter holds its own usage, whatever its name: one
// named "" got the usage of every resource together (Usage("") meant all
// of them), and a counter with no name.
func TestChromeTraceUnnamedResource(t *testing.T) {
	ev := func(seq uint64, k timeline.Kind, addr, size uint64, res string) timeline.Event {
		return timeline.Event{Seq: seq, Time: time.Duration(seq) * time.Microsecond, Kind: k, Addr: addr, Size: size, Resource: res}
	}
	tr := &timeline.Trace{Version: timeline.TraceVersion, Events: []timeline.Event{
		ev(1, timeline.Alloc, 0x1000, 100, ""),
		ev(2, timeline.Alloc, 0x2000, 200, "(unnamed)"),
		ev(3, timeline.Alloc, 0x3000, 400, "b"),
		ev(4, timeline.Free, 0x1000, 100, ""),
		ev(5, timeline.Free, 0x3000, 400, "b"),
	}}
	assert.Equal(t, []string{"", "(unnamed)", "b"}, tr.Resources())
	for r, want := range map[string][]uint64{"": {0, 100, 0}, "(unnamed)": {0, 200}, "b": {0, 400, 0}} {
		var got []uint64
		for _, u := range tr.Usage(r) {
			got = append(got, u.Bytes)
		}
		assert.Equal(t, want, got, "Usage(%q) is that resource's own", r)
	}
	var total []uint64
	for _, u := range tr.TotalUsage() {
		total = append(total, u.Bytes)
	}
	assert.Equal(t, []uint64{0, 100, 300, 700, 600, 200}, total)

	var buf bytes.Buffer
	require.NoError(t, tr.WriteChromeTrace(&buf))
	counters := map[string][]float64{}
	spans := map[string]string{} // addr -> span name
	for _, e := range readChrome(t, buf.Bytes()) {
		switch e["ph"] {
		case "C":
			name := e["name"].(string)
			counters[name] = append(counters[name], e["args"].(map[string]any)["bytes"].(float64))
		case "X":
			args := e["args"].(map[string]any)
			spans[args["addr"].(string)] = e["name"].(string)
			if args["addr"] == "0x1000" {
				assert.Equal(t, "", args["resource"], "the span keeps the resource's own name")
			}
		}
	}
	assert.Equal(t, map[string][]float64{
		"(unnamed 2)": {0, 100, 0},
		"(unnamed)":   {0, 200},
		"b":           {0, 400, 0},
	}, counters, "one counter per resource, each with its own usage")
	assert.Equal(t, "(unnamed 2) 100 B", spans["0x1000"])
}
