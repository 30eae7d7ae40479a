package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// servingBaseline writes a baseline program that serves as -serve does:
// a/c takes 1000 ns times the number of requests so far, with side s/c
// at 4 ns; other names are refused.
func servingBaseline(t *testing.T) string {
	if runtime.GOOS == "windows" {
		t.Skip("uses a shell script")
	}
	script := filepath.Join(t.TempDir(), "cgo-baseline")
	require.NoError(t, os.WriteFile(script, []byte(`#!/bin/sh
echo "serving: $*" >&2
echo
n=0
while read name; do
  n=$((n+1))
  case "$name" in
    a/c) echo '{"name":"a/c","ns_per_op":'$((n*1000))',"iters":10,"rep":1}'
         echo '{"name":"s/c","ns_per_op":4,"iters":10,"rep":1}' ;;
    *) echo '{"name":"'"$name"'","ns_per_op":0,"iters":0,"error":"not set up"}' ;;
  esac
  echo
done
`), 0o755))
	return script
}

// Each repetition of ours is paired with one of the baseline's, the order
// swapping every time: ours first in repetition 1, the baseline first in
// 2, and so on; the pair ratios and the baseline's numbering follow.
func TestRunOursAlternates(t *testing.T) {
	f := &benchFlags{baseline: servingBaseline(t), scale: 1, count: 3, growTo: 1 << 30}
	var stderr bytes.Buffer
	srv, err := startBaseline(f, []string{"a/c", "s/c"}, &stderr)
	require.NoError(t, err)
	p := &pairer{srv: srv, reps: map[string]int{}}
	sd := &side{name: "s", baseline: "s/c"}
	ms := []measurement{
		{name: "a", baseline: "a/c", iters: 100, sides: []*side{sd},
			run: func(n int) (time.Duration, error) {
				sd.d = time.Duration(n) * 2 * time.Nanosecond
				return time.Duration(n) * time.Microsecond, nil
			}},
		{name: "b", baseline: "b/c", iters: 1, run: func(n int) (time.Duration, error) { return time.Duration(n), nil }},
		{name: "c", iters: 1, run: func(n int) (time.Duration, error) { return time.Duration(n), nil }},
	}
	ours, err := runOurs(ms, 1, 3, io.Discard, p)
	require.NoError(t, err)
	require.NoError(t, p.err)
	require.NoError(t, srv.close())
	assert.Contains(t, stderr.String(), "serving: -device 0 -iters 1 -count 3 -grow-to 1073741824 -names a/c,s/c -serve")

	var pairs, sides []float64
	for _, r := range ours {
		switch r.Name {
		case "a":
			pairs = append(pairs, r.Pair)
		case "s":
			sides = append(sides, r.Pair)
		default:
			assert.Zero(t, r.Pair, "%s: no baseline figure to pair with", r.Name)
		}
	}
	// Requests 1 (after ours), 2 (before ours) and 3 (after): 1000, 2000
	// and 3000 ns against ours' 1000.
	assert.InDeltaSlice(t, []float64{1, 0.5, 1.0 / 3}, pairs, 1e-9)
	assert.InDeltaSlice(t, []float64{0.5, 0.5, 0.5}, sides, 1e-9)
	var base []string
	for _, r := range p.base {
		base = append(base, r.Name)
		assert.Empty(t, r.Error)
	}
	assert.Equal(t, []string{"a/c", "s/c", "a/c", "s/c", "a/c", "s/c"}, base, "refusals (b/c) leave no figure")
	assert.Equal(t, 3, p.base[4].Rep, "numbered per name")

	rows := ratioRows(ms, ours, p.base)
	require.NotEmpty(t, rows)
	assert.Equal(t, "0.50x (1.00 0.50 0.33)", pairCell(rows[0].Ours.Pairs))
	var out bytes.Buffer
	printBench(&out, ms, ours, p.base)
	assert.Contains(t, out.String(), "paired runs: median ratio (each pair)")
	assert.Contains(t, out.String(), "0.50x (1.00 0.50 0.33)")
}

// A program that does not serve (an older baseline, or one that fails at
// setup) is reported as such, with what it said.
func TestStartBaselineRefused(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("uses a shell script")
	}
	script := filepath.Join(t.TempDir(), "cgo-baseline")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho 'flag provided but not defined: -serve' >&2\nexit 2\n"), 0o755))
	_, err := startBaseline(&benchFlags{baseline: script, scale: 1, count: 1, growTo: 1 << 30}, []string{"a/c"}, io.Discard)
	assert.ErrorContains(t, err, "flag provided but not defined: -serve")

	// One that stops serving midway: the pairer pairs no more and says why.
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho\nread name\necho 'cgo-baseline: cuInit failed' >&2\nexit 1\n"), 0o755))
	srv, err := startBaseline(&benchFlags{baseline: script, scale: 1, count: 1, growTo: 1 << 30}, []string{"a/c"}, io.Discard)
	require.NoError(t, err)
	p := &pairer{srv: srv, reps: map[string]int{}}
	assert.Empty(t, p.once("a/c"))
	assert.ErrorContains(t, p.err, "cuInit failed")
	assert.Nil(t, p.once("a/c"), "no more requests")
}
