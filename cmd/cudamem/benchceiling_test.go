package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/staging"
)

// Every byte of every share is copied, whatever the length and the
// number of goroutines (shares are page-aligned, the last one short).
func TestInParallelCoversEveryByte(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 4096, 4097, 3*4096 + 5, 1 << 20} {
		for _, w := range []int{1, 3, 16} {
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(i*7 + 1)
			}
			dst := make([]byte, n)
			var calls atomic.Int32
			err := inParallel(w, dst, src, func(d, s []byte) error {
				calls.Add(1)
				copy(d, s)
				return nil
			})
			require.NoError(t, err)
			assert.True(t, bytes.Equal(dst, src), "n=%d w=%d", n, w)
			assert.LessOrEqual(t, int(calls.Load()), w, "n=%d w=%d", n, w)
		}
	}
	boom := fmt.Errorf("boom")
	err := inParallel(4, make([]byte, 1<<16), make([]byte, 1<<16), func(d, _ []byte) error {
		if len(d) > 0 {
			return boom
		}
		return nil
	})
	assert.ErrorIs(t, err, boom)
}

func TestCeilingKey(t *testing.T) {
	kind, size, w, ok := ceilingKey("ceiling/memmove_fresh/1GiB/w16")
	assert.True(t, ok)
	assert.Equal(t, []any{"memmove_fresh", "1GiB", 16}, []any{kind, size, w})
	for _, bad := range []string{"ceiling/map/1GiB", "ceiling/map/1GiB/16", "ceiling/map/1GiB/wx", "staging/dtoh/1GiB/fresh/w8"} {
		_, _, _, ok := ceilingKey(bad)
		assert.False(t, ok, bad)
	}
}

func TestPrintCeilings(t *testing.T) {
	var rs []result
	add := func(name string, gbps float64) {
		rs = append(rs, result{Name: name, NsPerOp: 1, GBps: gbps, Iters: 1, Rep: 1})
	}
	add("ceiling/map/1GiB/w16", 14.5)
	add("ceiling/map_huge/1GiB/w16", 30)
	add("ceiling/memmove/1GiB/w16", 40.25)
	add("ceiling/memmove_fresh/1GiB/w16", 11)
	add("ceiling/map/1GiB/w1", 9)
	add("ceiling/map/64MiB/w8", 12)
	add("hostcopy/dtoh/staged/1GiB", 23.3)
	add("hostcopy/dtoh/staged_fresh/1GiB", 10.2)
	var out strings.Builder
	printCeilings(&out, rs)
	s := out.String()
	assert.Contains(t, s, "ceilings, the host alone")
	lines := strings.Split(strings.TrimSpace(s), "\n")
	require.Len(t, lines, 5, s)
	assert.Regexp(t, `^64MiB\s+8\s+12\.0\s+-\s+-\s+-\s+-\s+-$`, lines[2])
	assert.Regexp(t, `^1GiB\s+1\s+9\.0\s+-\s+-\s+-\s+23\.3\s+10\.2$`, lines[3])
	assert.Regexp(t, `^1GiB\s+16\s+14\.5\s+30\.0\s+40\.2\s+11\.0\s+23\.3\s+10\.2$`, lines[4])

	out.Reset()
	printCeilings(&out, rs[6:])
	assert.Empty(t, out.String(), "no ceilings, no table")
}

// On the fake driver the ceilings run end to end, one figure per kind,
// size and goroutine count, and print their table.
func TestBenchCeilingsOnFakeDriver(t *testing.T) {
	env := fakeEnv(t, 1)
	code, stdout, stderr := runProcess(t, t.TempDir(), env, "bench", "-only", "ceiling/", "-max-copy", "1MiB", "-iters", "0.01", "-json")
	require.Equal(t, 0, code, stderr)
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var r result
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		kind, size, w, ok := ceilingKey(r.Name)
		require.True(t, ok, r.Name)
		assert.Equal(t, "1MiB", size)
		assert.Positive(t, r.GBps, r.Name)
		assert.Contains(t, ceilingWorkers(8), w)
		seen[kind] = true
	}
	assert.Equal(t, map[string]bool{"map": true, "map_huge": true, "memmove": true, "memmove_fresh": true}, seen)

	code, stdout, stderr = runProcess(t, t.TempDir(), env, "bench", "-only", "ceiling/", "-max-copy", "1MiB", "-iters", "0.01")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "ceilings, the host alone")
	assert.Regexp(t, fmt.Sprintf(`(?m)^1MiB\s+%d\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+-\s+-$`, runtime.GOMAXPROCS(0)), stdout)
}

// Copies that ask for huge pages get a destination of their own: the
// advice stays with a mapping, and on the shared one it would hand huge
// pages to every later fresh copy and ceiling of the run.
func TestFreshForHugePagesIsItsOwnMapping(t *testing.T) {
	h := &hostBufs{fresh: make([]byte, 8192), freshHuge: make([]byte, 8192)}
	p := staging.Current()
	p.HugePages = false
	assert.Same(t, &h.fresh[0], &h.freshFor(p)[0])
	p.HugePages = true
	assert.Same(t, &h.freshHuge[0], &h.freshFor(p)[0])
}
