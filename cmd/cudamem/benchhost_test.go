package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/staging"
)

func TestHostCopySizes(t *testing.T) {
	assert.Equal(t, []uint64{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}, hostCopySizes(1<<20))
	assert.Len(t, hostCopySizes(1<<30), 10, "4 KiB to 1 GiB in powers of 4")
	assert.Equal(t, []uint64{64 << 20, 1 << 30}, sweepSizes(1<<30))
	assert.Equal(t, []uint64{1 << 20}, sweepSizes(1<<20), "both capped by -max-copy, once")
	assert.Equal(t, 2000, hostIters(4<<10))
	assert.Equal(t, 2, hostIters(1<<30))
}

// The sweep's points are distinct, begin with the previous release's and
// the defaults, and each is a valid setting.
func TestSweepConfigs(t *testing.T) {
	def := staging.Params{MinBytes: 4 << 20, ChunkSize: 8 << 20, Chunks: 4, InWorkers: 8, OutWorkers: 8, Prefault: staging.PrefaultPopulate, Eager: true}
	for _, reused := range []bool{false, true} {
		cs := sweepConfigs(def, reused)
		assert.Equal(t, "before-w8-4x8MiB-off-lazy", cs[0].name)
		assert.Equal(t, "default-w8-4x8MiB-populate", cs[1].name)
		seen := map[string]bool{}
		for _, c := range cs {
			assert.False(t, seen[c.name], "%s twice", c.name)
			seen[c.name] = true
			assert.NoError(t, c.p.Check(), c.name)
			assert.Zero(t, c.p.MinBytes, "%s: every size staged", c.name)
		}
		if reused {
			assert.Len(t, cs, 5, "reused: before, default, and the worker counts")
		} else {
			assert.Greater(t, len(cs), 40)
			assert.True(t, seen["w8-4x8MiB-populate-huge"] && seen["w8-4x8MiB-touch"] && seen["w16-16x4MiB-off"])
		}
	}
}

func TestPrintHostCopies(t *testing.T) {
	var rs []result
	add := func(name string, gbps float64) {
		rs = append(rs, result{Name: hostCopyPrefix + name, NsPerOp: 1, GBps: gbps, Iters: 1, Rep: 1})
	}
	for _, c := range []struct {
		size                 string
		driver, staged, pinn float64
	}{{"4KiB", 5, 1, 6}, {"16KiB", 8, 9, 20}, {"64KiB", 9, 8, 30}, {"256KiB", 10, 20, 50}, {"1MiB", 11, 40, 55}} {
		for _, dir := range []string{"htod", "dtoh"} {
			add(dir+"/driver/"+c.size, c.driver)
			add(dir+"/staged/"+c.size, c.staged)
			add(dir+"/pinned/"+c.size, c.pinn)
		}
		add("dtoh/driver_fresh/"+c.size, c.driver/2)
		add("dtoh/staged_fresh/"+c.size, c.staged/5)
	}
	var out bytes.Buffer
	printHostCopies(&out, rs)
	s := out.String()
	assert.Contains(t, s, "| size | Go → device, driver | staged | pinned | device → Go, driver | staged | pinned | device → fresh Go, driver | staged |\n")
	assert.Contains(t, s, "| 1MiB | 11.0 | 40.0 (0.73x) | 55.0 | 11.0 | 40.0 (0.73x) | 55.0 | 5.5 | 8.0 (0.15x) |\n")
	// 16 KiB is faster staged, 64 KiB is not: the crossover is where
	// staging stays ahead at every size above.
	assert.Contains(t, s, "staging pays (Go → device): from 256KiB up\n")
	assert.Contains(t, s, "staging pays (device → Go): from 256KiB up\n")
	assert.Contains(t, s, "staging pays (device → fresh Go memory): from 1MiB up\n")
}

// On the fake driver, the host-copy and sweep families run end to end:
// every figure there, the staged ones with their breakdown, and the
// tables printed.
func TestBenchHostCopiesOnFakeDriver(t *testing.T) {
	env := fakeEnv(t, 1)
	dir := t.TempDir()
	code, stdout, stderr := runProcess(t, dir, env, "bench", "-only", "hostcopy/dtoh", "-max-copy", "256KiB", "-iters", "0.01", "-json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "bench: staging min=4MiB")
	n := 0
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var r result
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		_, variant, _, ok := hostKey(r.Name)
		require.True(t, ok, r.Name)
		if variant == "driver_fresh" || variant == "staged_fresh" {
			if runtime.GOOS != "linux" {
				continue
			}
		}
		n++
		assert.Positive(t, r.GBps, r.Name)
		if strings.HasPrefix(variant, "staged") {
			assert.Equal(t, 1.0, r.Extra["staged"], "%s: every copy staged", r.Name)
			assert.Contains(t, r.Extra, "wait_ms")
		} else {
			assert.Nil(t, r.Extra, r.Name)
		}
	}
	assert.Equal(t, 4*5, n, "4 sizes, 5 variants")

	// -log keeps every figure as it is made.
	code, _, stderr = runProcess(t, dir, env, "bench", "-only", "hostcopy/htod/pinned", "-max-copy", "16KiB", "-iters", "0.01", "-count", "2", "-log", "run.jsonl")
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(filepath.Join(dir, "run.jsonl"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 4, "2 sizes, 2 repetitions")
	var r result
	require.NoError(t, json.Unmarshal([]byte(lines[3]), &r))
	assert.Equal(t, result{Name: "hostcopy/htod/pinned/16KiB", NsPerOp: r.NsPerOp, GBps: r.GBps, Iters: r.Iters, Rep: 2}, r)

	code, stdout, stderr = runProcess(t, dir, env, "bench", "-only", "staging/", "-max-copy", "1MiB", "-iters", "0.01")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "staging sweep, device → Go")
	assert.Contains(t, stdout, "1MiB  reused       before-w8-4x8MiB-off-lazy")
	assert.Regexp(t, `best, 1MiB fresh destination: \S+ at [0-9.]+ GB/s`, stdout)
	assert.Regexp(t, `best, 1MiB reused destination: \S+ at [0-9.]+ GB/s`, stdout)
}
