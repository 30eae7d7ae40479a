package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cmd/cudamem/internal/trace"
)

// replayJSON runs `cudamem replay args... -json` in a process of its own
// with env and decodes its report.
func replayJSON(t *testing.T, dir string, env []string, args ...string) replayReport {
	t.Helper()
	code, stdout, stderr := runProcess(t, dir, env, append(append([]string{"replay"}, args...), "-json")...)
	require.Equal(t, 0, code, "%q: stdout:\n%s\nstderr:\n%s", args, stdout, stderr)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	return rep
}

// On the fake driver, each resource replays a generated trace: the peak
// live bytes and the counts are the trace's own, the resource held at
// least the live bytes at its peak, and after the trim everything is
// back on the device.
func TestReplayOnFakeDriver(t *testing.T) {
	env := fakeEnv(t, 1)
	for _, c := range []struct{ gen, steps string }{{"serving", "25"}, {"training", "1"}, {"random", "300"}} {
		ops, err := trace.Generate(c.gen, 2, mustAtoi(t, c.steps))
		require.NoError(t, err)
		want := trace.Summarize(ops)
		for _, res := range replayResources {
			rep := replayJSON(t, "", env, "-resource", res, "-gen", c.gen, "-seed", "2", "-steps", c.steps)
			name := c.gen + "/" + res
			assert.Equal(t, res, rep.Resource, name)
			assert.Equal(t, want.PeakLive, rep.PeakLive, name)
			assert.Equal(t, want.Allocations, rep.Allocations, name)
			assert.Equal(t, want.Frees, rep.Frees, name)
			assert.Zero(t, rep.LeftLive, name)
			assert.GreaterOrEqual(t, rep.PeakReserved, rep.PeakLive, name)
			assert.InDelta(t, float64(rep.PeakReserved)/float64(rep.PeakLive), rep.Ratio, 1e-9, name)
			assert.Equal(t, rep.DeviceFreeBefore, rep.DeviceFreeAfter, "%s: the memory is back on the device", name)
			assert.Positive(t, rep.MeanAllocNs, name)
			if res == "sync" {
				assert.Nil(t, rep.ReservedAfterTrim, name)
				assert.Zero(t, rep.ReservedAtEnd, name)
			} else if assert.NotNil(t, rep.ReservedAfterTrim, name) {
				assert.Zero(t, *rep.ReservedAfterTrim, "%s: nothing held after Trim", name)
				assert.Positive(t, rep.ReservedAtEnd, "%s: a pool keeps what was freed until Trim", name)
			}
		}
	}
	// A virtual pool that keeps nothing free maps what the serving trace
	// holds live, chunk by chunk, and nothing once it is all freed.
	rep := replayJSON(t, "", env, "-resource", "vpool", "-keep", "0", "-gen", "serving", "-seed", "1", "-steps", "25")
	assert.LessOrEqual(t, rep.Ratio, 1.03, "peak mapped over peak live")
	assert.Zero(t, rep.ReservedAtEnd)
}

func mustAtoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// gentrace writes the trace replay -in reads back: the same figures as
// replaying the generated one; a trace that leaves allocations live has
// them freed at the end; a bad line is refused with nothing replayed.
func TestGentraceReplayIn(t *testing.T) {
	env := fakeEnv(t, 1)
	dir := t.TempDir()
	code, stdout, stderr := runCmd("gentrace", "-gen", "serving", "-seed", "3", "-steps", "20", "-o", filepath.Join(dir, "t.txt"))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "t.txt: serving seed 3 steps 20 trace, ")
	gen := replayJSON(t, dir, env, "-gen", "serving", "-seed", "3", "-steps", "20")
	in := replayJSON(t, dir, env, "-in", "t.txt")
	assert.Equal(t, "t.txt", in.Trace)
	assert.Equal(t, gen.PeakLive, in.PeakLive)
	assert.Equal(t, gen.Allocations, in.Allocations)

	// The other replayers' format: "f ID 0"; and a trace that ends with
	// allocations live.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "live.txt"), []byte("a 1 1000\na 2 3000\nf 1 0\na 3 500\n"), 0o644))
	rep := replayJSON(t, dir, env, "-in", "live.txt", "-resource", "pool")
	assert.Equal(t, uint64(4000), rep.PeakLive)
	assert.Equal(t, 3, rep.Allocations)
	assert.Equal(t, 1, rep.Frees)
	assert.Equal(t, 2, rep.LeftLive)
	assert.Equal(t, rep.DeviceFreeBefore, rep.DeviceFreeAfter)

	for _, c := range []struct{ text, want string }{
		{"a 1 1000\nf 2\n", `line 2: "f 2": free of ID 2, which is not live`},
		{"a 1 1000\na 1 1\n", `line 2: "a 1 1": ID 1 is already live`},
		{"a 1 0\n", `line 1: "a 1 0": size 0`},
		{"a 1 99999999999999\n", `line 1: "a 1 99999999999999": size 99999999999999 exceeds the limit of`},
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.txt"), []byte(c.text), 0o644))
		code, stdout, stderr = runProcess(t, dir, env, "replay", "-in", "bad.txt")
		assert.Equal(t, 1, code, c.text)
		assert.Empty(t, stdout, c.text)
		assert.Contains(t, stderr, "cudamem replay: bad.txt: bad trace: "+c.want, c.text)
	}
	// -max-size bounds the sizes below the device's memory.
	code, _, stderr = runProcess(t, dir, env, "replay", "-in", "live.txt", "-max-size", "2KiB")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `cudamem replay: live.txt: bad trace: line 2: "a 2 3000": size 3000 exceeds the limit of 2048 bytes`)

	// The table names every figure.
	code, stdout, stderr = runProcess(t, dir, env, "replay", "-in", "t.txt")
	require.Equal(t, 0, code, stderr)
	for _, row := range []string{"peak live", "peak reserved", "reserved / live", "reserved after last free", "reserved after Trim", "mean Allocate", "device free before", "device free after"} {
		assert.Contains(t, stdout, "\n"+row+" ", row)
	}
}

// gentrace's output is deterministic, and the trace the package makes.
func TestGentraceStdout(t *testing.T) {
	code, a, stderr := runCmd("gentrace", "-gen", "random", "-seed", "5", "-steps", "100")
	require.Equal(t, 0, code, stderr)
	_, b, _ := runCmd("gentrace", "-gen", "random", "-seed", "5", "-steps", "100")
	assert.Equal(t, a, b)
	ops, err := trace.Parse(strings.NewReader(a), trace.Limits{})
	require.NoError(t, err)
	want, err := trace.Generate("random", 5, 100)
	require.NoError(t, err)
	assert.Equal(t, want, ops)
}

// Bad flags are usage errors, found before any driver is needed.
func TestReplayFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "-resource", "heap"}, `unknown -resource "heap"`},
		{[]string{"replay", "-gen", "chat"}, `unknown -gen "chat"`},
		{[]string{"replay", "-in", "t.txt", "-seed", "2"}, "-seed chooses a generated trace, which -in replaces"},
		{[]string{"replay", "-steps", "-3"}, "bad -steps -3"},
		{[]string{"replay", "-max-size", "0"}, "bad -max-size 0"},
		{[]string{"replay", "-device", "-1"}, "bad -device -1"},
		{[]string{"replay", "-keep", "0"}, "-keep is for -resource vpool"},
		{[]string{"gentrace", "-gen", "chat"}, `unknown -gen "chat"`},
		{[]string{"gentrace", "extra"}, "takes no arguments"},
	} {
		code, stdout, stderr := runCmd(c.args...)
		assert.Equal(t, 2, code, "%q: %s", c.args, stderr)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, c.want, c.args)
	}
	// A missing -in file is named, before the driver is looked for.
	code, _, stderr := runCmd("replay", "-in", filepath.Join(t.TempDir(), "none.txt"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "cudamem replay: -in: stat ")
}
