package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// The sample trace, testdata/timeline-sample.json, is the demo workload
// recorded on the fake driver. To make it again:
//
//	go generate ./cmd/cudamem
//
//go:generate go test -count=1 -run ^TestTimelineSampleGenerator$ -update-sample .
var updateSample = flag.Bool("update-sample", false, "write testdata/timeline-sample.json anew from the demo run on the fake driver")

const samplePath = "../../testdata/timeline-sample.json"

var fakeBuild struct {
	once       sync.Once
	dir, path  string // the library, built by the fake-driver command's code
	stdout     string // what `cudamem fake-driver -o dir` printed
	err        error
	code       int
	stderrText string
}

// fakeLibrary builds the fake driver once per test binary with `cudamem
// fake-driver -o DIR` and returns the library's path and what the command
// printed. Without a C compiler the test is skipped, unless
// fakecuda.Required.
func fakeLibrary(t *testing.T) (path, stdout string) {
	t.Helper()
	if _, err := fakecuda.Compiler(); err != nil {
		if fakecuda.Required() {
			t.Fatal(err)
		}
		t.Skipf("the fake driver needs a C compiler: %v", err)
	}
	fakeBuild.once.Do(func() {
		if fakeBuild.dir, fakeBuild.err = os.MkdirTemp("", "cudamem-fake-driver"); fakeBuild.err != nil {
			return
		}
		dir := filepath.Join(fakeBuild.dir, "lib")
		fakeBuild.code, fakeBuild.stdout, fakeBuild.stderrText = runCmd("fake-driver", "-o", dir)
		fakeBuild.path = filepath.Join(dir, fakeLib)
	})
	require.NoError(t, fakeBuild.err)
	require.Equal(t, 0, fakeBuild.code, fakeBuild.stderrText)
	return fakeBuild.path, fakeBuild.stdout
}

// fakeEnv points a process at the fake driver, with devices fake GPUs.
func fakeEnv(t *testing.T, devices int) []string {
	path, _ := fakeLibrary(t)
	return []string{"CUDAMEM_DRIVER=" + path, fmt.Sprintf("FAKECUDA_DEVICES=%d", devices)}
}

// `cudamem fake-driver -o DIR` builds the library and prints, as shell,
// the one line that selects it: eval of its output sets CUDAMEM_DRIVER.
func TestFakeDriverCommand(t *testing.T) {
	path, stdout := fakeLibrary(t)
	assert.True(t, fakecuda.Is(path), "%s is the fake driver", path)
	assert.FileExists(t, filepath.Join(filepath.Dir(path), "fakecuda.c"), "its source beside it")
	var exports []string
	for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		if strings.HasPrefix(line, "export ") {
			exports = append(exports, line)
			continue
		}
		assert.True(t, strings.HasPrefix(line, "#"), "every other line is a shell comment: %q", line)
	}
	assert.Equal(t, []string{"export CUDAMEM_DRIVER=" + path}, exports)
	assert.Contains(t, stdout, "FAKECUDA_DEVICES=2")
	assert.Contains(t, stdout, "unset CUDAMEM_DRIVER")
	assert.NotContains(t, filepath.Base(filepath.Dir(path)), ".build-", "built in a directory of its own, then moved")
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 2, "the library and its source, nothing left of the build")

	if sh, err := exec.LookPath("sh"); err == nil {
		out, err := exec.Command(sh, "-c", stdout+`printf %s "$CUDAMEM_DRIVER"`).Output()
		require.NoError(t, err)
		assert.Equal(t, path, string(out), "eval \"$(cudamem fake-driver)\" selects it")
	}

	// Built again into the same directory: replaced, still one library.
	code, _, stderr := runCmd("fake-driver", "-o", filepath.Dir(path))
	require.Equal(t, 0, code, stderr)
	entries, err = os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 2)

	assert.Equal(t, `'/a b/it'\''s'`, shellQuote("/a b/it's"))
	assert.Equal(t, "/home/u/.cache/cudamem/fake-driver/libfakecuda.so", shellQuote("/home/u/.cache/cudamem/fake-driver/libfakecuda.so"))
}

// Without -o the library goes to the user's cache directory; without one
// the command asks for -o.
func TestFakeDriverDefaultDir(t *testing.T) {
	fakeLibrary(t) // skips without a compiler
	cache := t.TempDir()
	code, stdout, stderr := runProcess(t, "", []string{"XDG_CACHE_HOME=" + cache}, "fake-driver")
	require.Equal(t, 0, code, stderr)
	path := filepath.Join(cache, "cudamem", "fake-driver", fakeLib)
	assert.Contains(t, stdout, "\nexport CUDAMEM_DRIVER="+path+"\n")
	assert.True(t, fakecuda.Is(path))

	code, stdout, stderr = runProcess(t, "", []string{"XDG_CACHE_HOME=", "HOME="}, "fake-driver")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "cudamem fake-driver: no user cache directory to build in (")
	assert.Contains(t, stderr, "name one with -o DIR")
}

// Without a C compiler the command says what it needs and makes nothing.
func TestFakeDriverNoCompiler(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := runProcess(t, "", []string{"CC=/no/such/cc"}, "fake-driver", "-o", dir)
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.True(t, strings.HasPrefix(stderr, "cudamem fake-driver: building the fake driver needs a C compiler (gcc or clang; $CC names another): fakecuda: no C compiler (/no/such/cc)"), stderr)
	assert.NoDirExists(t, dir)
}

// On the fake driver, info, selftest and version say so, and the
// commands run: selftest's checks (its kernels too) pass, with two fake
// GPUs the peer copies as well, and the timeline demo draws its picture.
func TestCommandsOnFakeDriver(t *testing.T) {
	env := fakeEnv(t, 2)
	path, _ := fakeLibrary(t)
	dir := t.TempDir()

	code, stdout, stderr := runProcess(t, dir, env, "info")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "driver:  "+path+" (CUDA 13.0)\nnote:    this is cudamem's fake driver: host memory, no GPU (unset CUDAMEM_DRIVER for the real one)\n")
	assert.Contains(t, stdout, "GPU 0: cudamem fake GPU 0 (host memory)\n")
	assert.Contains(t, stdout, "GPU 1: cudamem fake GPU 1 (host memory)\n")

	code, stdout, stderr = runProcess(t, dir, env, "info", "-json")
	require.Equal(t, 0, code, stderr)
	var info Info
	require.NoError(t, json.Unmarshal([]byte(stdout), &info))
	assert.True(t, info.Driver.Fake)

	code, stdout, stderr = runProcess(t, dir, env, "selftest")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.True(t, strings.HasPrefix(stdout, "driver: cudamem's fake driver: host memory, no GPU"), stdout)
	assert.Regexp(t, `\nall 10 checks passed, on the fake driver\n$`, stdout)
	assert.Contains(t, stdout, "ok   GPU 0 -> GPU 1: peer copy")
	assert.NotContains(t, stdout, "skip")

	code, stdout, stderr = runProcess(t, dir, env, "version")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "("+path+"), cudamem's fake driver")

	code, stdout, stderr = runProcess(t, dir, env, "timeline", "-steps", "2", "-o", "demo.svg", "-json", "demo.json")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `^demo.svg: \d+ events, pool blocks peak`, stdout)
	data, err := os.ReadFile(filepath.Join(dir, "demo.svg"))
	require.NoError(t, err)
	assert.Positive(t, countBands(t, data))

	// A -device the machine does not have is a bad flag, named as such.
	for _, args := range [][]string{{"timeline", "-device", "5", "-o", "d.svg"}, {"bench", "-device", "5", "-only", "trivial"}} {
		code, stdout, stderr = runProcess(t, dir, env, args...)
		assert.Equal(t, 2, code, "%q: %s", args, stderr)
		assert.Empty(t, stdout)
		assert.True(t, strings.HasPrefix(stderr, "cudamem "+args[0]+": bad -device 5: this machine has 2 GPU(s), ordinals from 0\n"), "%q: %s", args, stderr)
	}
	assert.NoFileExists(t, filepath.Join(dir, "d.svg"))

	// The real driver's machines say nothing of the kind.
	withSource(t, fakeSource{})
	code, stdout, _ = runCmd("info")
	assert.Equal(t, 0, code)
	assert.NotContains(t, stdout, "fake driver")
}

// The README's first program, as a user pastes it into a module of
// their own, runs on the fake driver and prints what the README says.
func TestReadmeFirstProgramOnFakeDriver(t *testing.T) {
	env := fakeEnv(t, 1)
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?ms)^## A first program\n.*?^```go\n(.*?)^```").FindSubmatch(md)
	require.NotNil(t, m, "README.md has a ```go block under \"## A first program\"")
	src := string(m[1])
	want := regexp.MustCompile(`fmt\.Println\(.*\) // (\S+)\n`).FindStringSubmatch(src)
	require.NotNil(t, want, "the program says what it prints")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644))
	mod := fmt.Sprintf("module readme.example\n\ngo 1.24\n\nrequire github.com/cudamem/cudamem v0.0.0\n\nreplace github.com/cudamem/cudamem => %s\n", filepath.ToSlash(root))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	prog := filepath.Join(t.TempDir(), "first")
	build := exec.Command(gotool, "build", "-o", prog, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOSUMDB=off", "GOTOOLCHAIN=local")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	run := exec.Command(prog)
	run.Env = append(os.Environ(), env...)
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, want[1]+"\n", string(out))
}

// The committed sample trace draws without a GPU: what README and docs
// tell a user to try first.
func TestTimelineSample(t *testing.T) {
	code, stdout, stderr := runCmd("timeline", "-in", samplePath, "-o", "-")
	require.Equal(t, 0, code, stderr)
	assert.Greater(t, countBands(t, []byte(stdout)), 100)
	dir := t.TempDir()
	code, stdout, stderr = runCmd("timeline", "-in", samplePath, "-o", filepath.Join(dir, "t.svg"))
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `t.svg: \d+ events, pool blocks peak 32.0 MiB, suballocator peak \d+\.\d MiB, pool direct peak \d+\.\d MiB\n$`, stdout)
}

// The sample's generator: the demo workload recorded on the fake driver,
// as `cudamem timeline -json` writes it. Run always, into a temporary
// file, so that it cannot rot; with -update-sample (go generate) it
// writes testdata/timeline-sample.json.
func TestTimelineSampleGenerator(t *testing.T) {
	env := fakeEnv(t, 1)
	out := filepath.Join(t.TempDir(), "sample.json")
	if *updateSample {
		var err error
		out, err = filepath.Abs(samplePath)
		require.NoError(t, err)
	}
	code, stdout, stderr := runProcess(t, "", env, "timeline", "-json", out, "-o", os.DevNull)
	require.Equal(t, 0, code, stderr)
	t.Log(strings.TrimSpace(stdout))
	tr, err := readTrace(out)
	require.NoError(t, err)
	assert.Equal(t, []string{"pool blocks", "suballocator", "pool direct"}, tr.Resources())
	sample, err := readTrace(samplePath)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is missing: make it with go generate ./cmd/cudamem", samplePath)
	}
	require.NoError(t, err)
	assert.Equal(t, tr.Resources(), sample.Resources(), "the sample is this demo's")
	assert.InDelta(t, len(tr.Events), len(sample.Events), float64(len(tr.Events))/5, "the sample is the default demo's size")
}
