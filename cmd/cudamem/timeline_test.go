package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/resource/timeline"
)

// countBands decodes an SVG (it must be well-formed) and counts its bands.
func countBands(t *testing.T, data []byte) int {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return n
		}
		require.NoError(t, err)
		if el, ok := tok.(xml.StartElement); ok {
			for _, a := range el.Attr {
				if a.Name.Local == "class" && a.Value == "band" {
					n++
				}
			}
		}
	}
}

// TestTimelineFromJSON: -in draws a dump without a GPU; -json writes the
// trace back out.
func TestTimelineFromJSON(t *testing.T) {
	dir := t.TempDir()
	rec := timeline.NewRecorder(&testutil.MadeUp{}, nil, &timeline.RecorderOptions{Name: "pool"})
	var keep []*buffer.Buffer
	for i := range 30 {
		b, err := rec.Allocate(uint64(i+1)<<12, nil)
		require.NoError(t, err)
		if i%2 == 0 {
			require.NoError(t, b.Close())
		} else {
			keep = append(keep, b)
		}
	}
	in := filepath.Join(dir, "trace.json")
	f, err := os.Create(in)
	require.NoError(t, err)
	require.NoError(t, rec.Log().Trace().WriteJSON(f))
	require.NoError(t, f.Close())

	svg, again := filepath.Join(dir, "out.svg"), filepath.Join(dir, "again.json")
	var stdout, stderr bytes.Buffer
	require.NoError(t, runTimeline([]string{"-in", in, "-o", svg, "-json", again, "-by-event"}, &stdout, &stderr))
	assert.Contains(t, stdout.String(), "out.svg: 45 events, pool peak")
	data, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.Equal(t, 30, countBands(t, data))
	a, err := os.ReadFile(in)
	require.NoError(t, err)
	b, err := os.ReadFile(again)
	require.NoError(t, err)
	assert.JSONEq(t, string(a), string(b))

	// To standard output.
	stdout.Reset()
	require.NoError(t, runTimeline([]string{"-in", in, "-o", "-", "-max-bands", "5"}, &stdout, &stderr))
	assert.Equal(t, 5, countBands(t, stdout.Bytes()))
	for _, k := range keep {
		require.NoError(t, k.Close())
	}
}

func TestTimelineErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"version": 9, "events": []}`), 0o644))
	var stdout, stderr bytes.Buffer
	err := runTimeline([]string{"-in", bad, "-o", filepath.Join(dir, "x.svg")}, &stdout, &stderr)
	require.Error(t, err)
	assert.NotErrorIs(t, err, cuda.ErrInvalidArgument, "a file that is no trace is no CUDA error")
	assert.Equal(t, "reading the trace "+bad+": trace version 9; this reader knows version 1", err.Error())

	err = runTimeline([]string{"-in", filepath.Join(dir, "missing.json")}, &stdout, &stderr)
	require.ErrorIs(t, err, os.ErrNotExist)

	require.ErrorIs(t, runTimeline([]string{"extra"}, &stdout, &stderr), errUsage)
	require.ErrorIs(t, runTimeline([]string{"-o", ""}, &stdout, &stderr), errUsage)
	require.ErrorIs(t, runTimeline([]string{"-h"}, &stdout, &stderr), flag.ErrHelp)
	assert.Contains(t, stderr.String(), "-in FILE")

	ok := filepath.Join(dir, "ok.json")
	require.NoError(t, os.WriteFile(ok, []byte(`{"version": 1, "events": []}`), 0o644))
	err = runTimeline([]string{"-in", ok, "-o", filepath.Join(dir, "no", "such", "dir.svg")}, &stdout, &stderr)
	require.Error(t, err)
}

// TestTimelineDemo runs the demo workload on a GPU (skipped without one).
func TestTimelineDemo(t *testing.T) {
	cudatest.Device(t)
	dir := t.TempDir()
	svg, js := filepath.Join(dir, "demo.svg"), filepath.Join(dir, "demo.json")
	var stdout, stderr bytes.Buffer
	require.NoError(t, runTimeline([]string{"-o", svg, "-json", js, "-steps", "4", "-stacks"}, &stdout, &stderr), stderr.String())
	t.Log(stdout.String())
	data, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.Positive(t, countBands(t, data))
	assert.Contains(t, string(data), `class="segment"`)
	assert.True(t, strings.Contains(stdout.String(), "suballocator peak"), stdout.String())
	// The dump draws the same picture's bands.
	stdout.Reset()
	require.NoError(t, runTimeline([]string{"-in", js, "-o", "-"}, &stdout, &stderr))
	assert.Equal(t, countBands(t, data), countBands(t, stdout.Bytes()))
}
