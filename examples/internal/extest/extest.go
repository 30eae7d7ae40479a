// Package extest runs the example programs as their users do, as
// processes of their own, for the examples' tests: with -h and bad flags,
// without a driver, and on the fake driver (internal/testkit/fakecuda). The
// test binary is the program: Main makes it run the example's main when
// Run starts it.
package extest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// envRunMain makes the test binary run the example's main instead of its
// tests.
const envRunMain = "CUDAMEM_EXAMPLE_RUN_MAIN"

// Main is an example's TestMain: in a process Run started it runs the
// example's main, else the tests.
func Main(m *testing.M, main func()) {
	if os.Getenv(envRunMain) == "1" {
		main()
		os.Exit(0)
	}
	code := m.Run()
	if fake.dir != "" {
		os.RemoveAll(fake.dir)
	}
	os.Exit(code)
}

// Run runs the example with args, env added to this process's
// environment, and returns its exit status and output.
func Run(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(append(os.Environ(), envRunMain+"=1"), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), o.String(), e.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, o.String(), e.String()
}

// NoDriver is an environment in which no driver loads (CUDAMEM_DRIVER
// names a library that does not exist), on any machine, and that path.
func NoDriver(t *testing.T) (env []string, path string) {
	path = filepath.Join(t.TempDir(), "no-such-libcuda.so.1")
	return []string{"CUDAMEM_DRIVER=" + path}, path
}

var fake struct {
	once      sync.Once
	dir, path string
	err       error
}

// Fake is an environment that points the example at the fake driver
// (FAKECUDA_DEVICES devices), built once per test binary. Without a C
// compiler the test is skipped, unless fakecuda.Required.
func Fake(t *testing.T, devices string) []string {
	t.Helper()
	fake.once.Do(func() {
		if fake.dir, fake.err = os.MkdirTemp("", "extest-fake"); fake.err == nil {
			fake.path, fake.err = fakecuda.Build(fake.dir)
		}
	})
	switch {
	case errors.Is(fake.err, fakecuda.ErrNoCompiler) && !fakecuda.Required():
		t.Skipf("the fake driver needs a C compiler: %v", fake.err)
	case fake.err != nil:
		t.Fatal(fake.err)
	}
	return []string{"CUDAMEM_DRIVER=" + fake.path, "FAKECUDA_DEVICES=" + devices}
}

// CheckFlags checks that the example named name answers -h with its
// usage on stderr and status 0, and a bad flag or an argument it does not
// take with the error and its usage on stderr and status 2, running
// nothing.
func CheckFlags(t *testing.T, name string) {
	t.Helper()
	env, _ := NoDriver(t) // nothing may get as far as the driver
	for _, h := range []string{"-h", "-help", "--help"} {
		code, stdout, stderr := Run(t, env, h)
		if code != 0 || stdout != "" || !strings.HasPrefix(stderr, "usage: "+name) {
			t.Errorf("%s %s: status %d, stdout %q, stderr %q; want status 0 and the usage on stderr", name, h, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{"-no-such-flag"}, {"extra-argument"}} {
		code, stdout, stderr := Run(t, env, args...)
		if code != 2 || stdout != "" || !strings.HasPrefix(stderr, name+": ") || !strings.Contains(stderr, "\nusage: "+name) {
			t.Errorf("%s %q: status %d, stdout %q, stderr %q; want status 2, the error and the usage on stderr", name, args, code, stdout, stderr)
		}
		if strings.Contains(stderr, "no CUDA driver") {
			t.Errorf("%s %q went on to look for a driver: %q", name, args, stderr)
		}
	}
}

// CheckNoDriver checks that the example, run with args and no driver,
// exits with status 1 and one line that names the example, says "CUDA
// driver" once (no prefix that repeats what the error says) and names the
// path tried.
func CheckNoDriver(t *testing.T, name string, args ...string) {
	t.Helper()
	env, path := NoDriver(t)
	code, stdout, stderr := Run(t, env, args...)
	if code != 1 || stdout != "" {
		t.Errorf("%s without a driver: status %d, stdout %q; want status 1 and nothing on stdout", name, code, stdout)
	}
	if !strings.HasPrefix(stderr, name+": ") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("%s without a driver: stderr is not one line starting %q: %q", name, name+": ", stderr)
	}
	if n := strings.Count(stderr, "CUDA driver"); n != 1 || !strings.Contains(stderr, path) {
		t.Errorf("%s without a driver: stderr says \"CUDA driver\" %d times (want once) or does not name %s: %q", name, n, path, stderr)
	}
}
