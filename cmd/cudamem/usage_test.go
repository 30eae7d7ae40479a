package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// envRunCLI makes the test binary run the command line instead of the
// tests, so tests can run cudamem as a process of its own (exit status,
// environment such as CUDAMEM_DRIVER read at the first load).
const envRunCLI = "CUDAMEM_TEST_RUN_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(envRunCLI) == "1" {
		main()
	}
	code := m.Run()
	if fakeBuild.dir != "" {
		os.RemoveAll(fakeBuild.dir)
	}
	os.Exit(code)
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
	assert.Contains(t, stderr, "usage: cudamem help [COMMAND]")
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

// One style of placeholders everywhere: every flag that takes a value
// names it with an upper-case word in its usage (-o FILE, -device
// ORDINAL), never the flag package's type names (-o string, -steps int),
// and the usage lines use the same (COMMAND, DIR), never <command>.
func TestUsagePlaceholderStyle(t *testing.T) {
	flagLine := regexp.MustCompile(`^  -([a-z][a-z0-9-]*)(?: (\S+))?$`)
	placeholder := regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	texts := []string{usage()}
	for _, c := range commands {
		code, stdout, stderr := runCmd(c.name, "-h")
		require.Equal(t, 0, code, stderr)
		texts = append(texts, stdout)
		flags := 0
		for _, line := range strings.Split(stdout, "\n") {
			if !strings.HasPrefix(line, "  -") {
				continue
			}
			m := flagLine.FindStringSubmatch(line)
			if assert.NotNil(t, m, "%s: flag line %q", c.name, line) && m[2] != "" {
				assert.Regexp(t, placeholder, m[2], "%s -%s: placeholder", c.name, m[1])
			}
			flags++
		}
		// The usage line names the same placeholders as the flags do.
		for _, m := range regexp.MustCompile(`-([a-z-]+) ([A-Za-z]+)\]`).FindAllStringSubmatch(usageLine(c.name), -1) {
			assert.Regexp(t, placeholder, m[2], "%s usage line: -%s", c.name, m[1])
			assert.Contains(t, stdout, "  -"+m[1]+" "+m[2]+"\n", "%s: the usage line's placeholder is the flag's", c.name)
		}
		t.Logf("%s: %d flags", c.name, flags)
	}
	for _, text := range texts {
		assert.NotRegexp(t, `<[a-z]+>`, text)
		assert.NotContains(t, text, "[command]")
	}
}

// The demo's flags do nothing to a trace read with -in: refused, naming
// the flag, instead of being silently ignored (-in t.json -stacks was
// accepted). -pprof - (a binary profile on standard output) is refused.
func TestTimelineRefusesFlagsThatDoNothing(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "t.json")
	writeTrace(t, in)
	for _, demo := range [][]string{
		{"-stacks"}, {"-device", "0"}, {"-steps", "3"}, {"-capacity", "100"}, {"-seed", "7"},
		{"-pprof", filepath.Join(dir, "p.pb.gz")},
	} {
		args := append([]string{"timeline", "-in", in, "-o", filepath.Join(dir, "x.svg")}, demo...)
		code, stdout, stderr := runCmd(args...)
		assert.Equal(t, 2, code, "%q: %s", demo, stderr)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, "cudamem timeline: "+demo[0]+" applies to the demo run; -in draws a trace that was already recorded\n", demo)
	}
	code, _, stderr := runCmd("timeline", "-pprof", "-")
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "-pprof - would mix a binary profile")
	assert.Equal(t, []string{"t.json"}, dirNames(t, dir))
	// The flags that shape the picture go with -in.
	code, _, stderr = runCmd("timeline", "-in", in, "-o", filepath.Join(dir, "x.svg"), "-by-event", "-max-bands", "3", "-at", "2")
	assert.Equal(t, 0, code, stderr)
}

// bench: -grow-to sets the size of one measurement; with an -only that
// leaves it out it would do nothing, and is refused.
func TestBenchRefusesFlagsThatDoNothing(t *testing.T) {
	for _, args := range [][]string{{"-grow-to", "1GiB", "-only", "trivial"}, {"-grow-to", "1GiB", "-only", "vmm/growstep/to8GiB"}} {
		code, stdout, stderr := runCmd(append([]string{"bench"}, args...)...)
		assert.Equal(t, 2, code, "%q: %s", args, stderr)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, "-grow-to sets the size of vmm/growstep/to1GiB/first16, which -only", args)
	}
	for _, args := range [][]string{{"-grow-to", "1GiB", "-only", "vmm/grow"}, {"-grow-to", "1GiB"}, {"-only", "trivial"}} {
		_, err := parseBenchFlags(args, io.Discard)
		assert.NoError(t, err, "%q", args)
	}
}

// bench -svg draws ratios to the C baseline: without one it says so, at
// once, instead of drawing an empty chart, and leaves no file.
func TestBenchSVGNeedsBaseline(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(filepath.Dir(exe), "cgo-baseline")); err == nil {
		t.Skip("a cgo-baseline lies beside the test binary")
	}
	dir := t.TempDir()
	chart := filepath.Join(dir, "chart.svg")
	code, stdout, stderr := runCmd("bench", "-svg", chart, "-only", "trivial")
	assert.Equal(t, 1, code, stderr)
	assert.Empty(t, stdout)
	assert.True(t, strings.HasPrefix(stderr, "cudamem bench: -svg draws the ratios to the C baseline, and there is none: "), stderr)
	assert.Contains(t, stderr, "CGO_ENABLED=1 go build -o cgo-baseline ./testdata/cgobench")
	assert.Empty(t, dirNames(t, dir), "no chart, no temporary file")

	// A baseline that ran but gave no figure for what ran: no chart
	// either, and the command fails saying why.
	ms := []measurement{{name: "trivial/go", baseline: "trivial/cgo"}}
	ours := []result{{Name: "trivial/go", NsPerOp: 90, Rep: 1}}
	svg, err := openOut("-svg", chart, nil)
	require.NoError(t, err)
	err = report("table", svg, ms, ours, nil, errors.New("cgo-baseline: exit status 1"), io.Discard, io.Discard)
	assert.ErrorContains(t, err, "-svg "+chart+" not written: no measurement has both a figure of its own and a C baseline figure")
	assert.Empty(t, dirNames(t, dir))
}

// A check the device or driver cannot run is a skip whose line carries
// the error once, not "not supported: cuda: not supported: ...".
func TestSelftestStepLines(t *testing.T) {
	var b bytes.Buffer
	failed := runSteps(&b, []step{
		{"fine", func() error { return nil }},
		{"no VMM", func() error { return fmt.Errorf("virtual.New: %w", cuda.ErrNotSupported) }},
		{"broken", func() error { return errors.New("the host reads different bytes") }},
	})
	assert.Equal(t, 1, failed)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 3)
	assert.Regexp(t, `^ok   fine\s+\d+\.\d\d ms$`, lines[0])
	assert.Regexp(t, `^skip no VMM\s+\d+\.\d\d ms  virtual.New: cuda: not supported$`, lines[1])
	assert.Regexp(t, `^FAIL broken\s+\d+\.\d\d ms  the host reads different bytes$`, lines[2])
}
