package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envRunCLI makes the test binary run the command line instead of the
// tests, so tests can run cudamem as a process of its own (exit status,
// environment such as CUDAMEM_DRIVER read at the first load).
const envRunCLI = "CUDAMEM_TEST_RUN_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(envRunCLI) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// runProcess runs cudamem args in a process of its own, with env added,
// from dir.
func runProcess(t *testing.T, dir string, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), envRunCLI+"=1"), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), o.String(), e.String()
	}
	require.NoError(t, err)
	return 0, o.String(), e.String()
}

// noDriverEnv points the loader at a library that does not exist, so a
// process fails to load the driver on any machine, GPU or not.
func noDriverEnv(t *testing.T) (env []string, path string) {
	path = filepath.Join(t.TempDir(), "no-such-libcuda.so.1")
	return []string{"CUDAMEM_DRIVER=" + path}, path
}

func TestVersionHelp(t *testing.T) {
	for _, args := range [][]string{{"version", "-h"}, {"version", "--help"}, {"-version", "-h"}, {"help", "version"}, {"help", "-version"}} {
		code, stdout, stderr := runCmd(args...)
		assert.Equal(t, 0, code, "%q: %s", args, stderr)
		assert.Empty(t, stderr, args)
		assert.True(t, strings.HasPrefix(stdout, "usage: cudamem version\n"), "%q: %q", args, stdout)
		assert.Contains(t, stdout, "version", args)
		assert.NotContains(t, stdout, "driver:", "%q printed the version instead of its usage", args)
	}
}

// `cudamem help COMMAND` prints what `cudamem COMMAND -h` prints.
func TestHelpCommand(t *testing.T) {
	for _, c := range commands {
		code, stdout, stderr := runCmd("help", c.name)
		assert.Equal(t, 0, code, "%s: %s", c.name, stderr)
		assert.Empty(t, stderr, c.name)
		_, want, _ := runCmd(c.name, "-h")
		assert.Equal(t, want, stdout, c.name)
		assert.True(t, strings.HasPrefix(stdout, usageLine(c.name)+"\n"), "%s: %q", c.name, stdout)
	}
	code, stdout, _ := runCmd("help", "info")
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "-json")
	code, stdout, _ = runCmd("help", "help")
	assert.Equal(t, 0, code)
	assert.Contains(t, stdout, "commands:")

	code, stdout, stderr := runCmd("help", "frobnicate")
	assert.Equal(t, 2, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, `unknown command "frobnicate"`)
	code, _, stderr = runCmd("help", "info", "bench")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "usage: cudamem help [command]")
}

// A bad flag, a bad flag value or a bad argument prints the error and the
// command's own usage line, nothing of the flag package's own usage (no
// "Usage of info:", no list of every flag), and exits with status 2.
func TestBadFlagPrintsCommandUsage(t *testing.T) {
	cases := [][]string{{"bench", "-iters", "lots"}, {"timeline", "-steps", "x"}, {"info", "extra"}, {"version", "extra"}}
	for _, c := range commands {
		cases = append(cases, []string{c.name, "-no-such-flag"})
	}
	for _, args := range cases {
		name := args[0]
		code, stdout, stderr := runCmd(args...)
		assert.Equal(t, 2, code, "%q: %s", args, stderr)
		assert.Empty(t, stdout, args)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if assert.Len(t, lines, 3, "%q: %q", args, stderr) {
			assert.True(t, strings.HasPrefix(lines[0], "cudamem "+name+": "), "%q: %q", args, lines[0])
			assert.Equal(t, usageLine(name), lines[1], args)
			assert.Equal(t, "Run 'cudamem "+name+" -h' for details.", lines[2], args)
		}
		assert.NotContains(t, stderr, "Usage of", args)
	}
	// The same from a process of its own: exit status 2.
	code, _, stderr := runProcess(t, "", nil, "info", "-no-such-flag")
	assert.Equal(t, 2, code)
	assert.Equal(t, "cudamem info: flag provided but not defined: -no-such-flag\nusage: cudamem info [-json]\nRun 'cudamem info -h' for details.\n", stderr)
}

// Numeric flags out of range are usage errors, found before anything runs.
func TestTimelineFlagRanges(t *testing.T) {
	for _, args := range [][]string{
		{"-steps", "-1"}, {"-capacity", "-5"}, {"-max-bands", "-1"}, {"-device", "-1"},
		{"-o", "same.out", "-json", "same.out"}, {"-o", "-", "-json", "-"},
	} {
		code, stdout, stderr := runCmd(append([]string{"timeline"}, args...)...)
		assert.Equal(t, 2, code, "%q: %s", args, stderr)
		assert.Empty(t, stdout, args)
		assert.Contains(t, stderr, "usage: cudamem timeline", args)
		assert.Contains(t, stderr, args[0], args)
	}
	code, _, stderr := runCmd("timeline", "-steps", "-1")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "bad -steps -1")
	code, _, stderr = runCmd("bench", "-device", "-1")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "bad -device -1")
}

// timeline -o (and -json) are opened before the demo runs: a file that
// cannot be written is the error, on a machine with a GPU or without.
func TestTimelineChecksOutputFirst(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "no", "such", "dir", "t.svg")
	var stdout, stderr bytes.Buffer
	err := runTimeline([]string{"-o", bad, "-steps", "1"}, &stdout, &stderr)
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), bad)
	assert.NotContains(t, err.Error(), "driver")

	err = runTimeline([]string{"-o", filepath.Join(dir, "ok.svg"), "-json", dir, "-steps", "1"}, &stdout, &stderr)
	require.Error(t, err, "a directory is not a file to write")
	assert.NotContains(t, err.Error(), "driver")
	_, statErr := os.Stat(filepath.Join(dir, "ok.svg"))
	assert.ErrorIs(t, statErr, fs.ErrNotExist, "the SVG file made for the run is removed again")

	code, _, errText := runCmd("timeline", "-o", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, errText, bad)

	// bench -svg the same way, before it looks for a GPU.
	code, _, errText = runCmd("bench", "-svg", bad, "-only", "trivial")
	assert.Equal(t, 1, code)
	assert.Contains(t, errText, bad)
	assert.NotContains(t, errText, "driver")

	// -cpuprofile too; and "-" (stdout) is refused, the profile being
	// binary.
	code, _, errText = runCmd("bench", "-cpuprofile", bad, "-only", "trivial")
	assert.Equal(t, 1, code)
	assert.Contains(t, errText, bad)
	assert.NotContains(t, errText, "driver")
	code, _, errText = runCmd("bench", "-cpuprofile", "-", "-only", "trivial")
	assert.Equal(t, 2, code, errText)
	assert.Contains(t, errText, "-cpuprofile -")
}

// Without a driver, timeline says which paths it tried, like info, bench
// and selftest; it leaves no output file behind and does not touch an
// existing one.
func TestTimelineNoDriverListsPaths(t *testing.T) {
	env, missing := noDriverEnv(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "old.json"), []byte("keep"), 0o644))
	code, stdout, stderr := runProcess(t, dir, env, "timeline", "-o", "new.svg", "-json", "old.json")
	assert.Equal(t, 1, code, stderr)
	assert.Empty(t, stdout)
	assert.True(t, strings.HasPrefix(stderr, "cudamem timeline: no CUDA driver found\n"), stderr)
	assert.Contains(t, stderr, "\n  tried "+missing+" (from CUDAMEM_DRIVER): ")
	assert.NotContains(t, stderr, "goroutine")
	_, err := os.Stat(filepath.Join(dir, "new.svg"))
	assert.ErrorIs(t, err, fs.ErrNotExist, "no empty SVG left behind")
	old, err := os.ReadFile(filepath.Join(dir, "old.json"))
	require.NoError(t, err)
	assert.Equal(t, "keep", string(old), "an existing file is kept as it was")

	// The other commands that need a driver say the same.
	for _, args := range [][]string{{"info"}, {"selftest"}, {"bench", "-only", "trivial"}} {
		code, _, stderr := runProcess(t, dir, env, args...)
		assert.Equal(t, 1, code, "%q: %s", args, stderr)
		assert.True(t, strings.HasPrefix(stderr, "cudamem "+args[0]+": no CUDA driver found\n  tried "+missing), "%q: %s", args, stderr)
	}
}
