package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
)

func TestVersion(t *testing.T) {
	for _, arg := range []string{"-version", "--version", "version"} {
		code, stdout, stderr := runCmd(arg)
		require.Equal(t, 0, code, stderr)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		require.Len(t, lines, 2, stdout)
		assert.Regexp(t, `^cudamem (\(devel\)|v\S+)`, lines[0])
		assert.Contains(t, lines[0], "go1")
		if _, _, err := cuda.Driver(); errors.Is(err, cuda.ErrNoDriver) {
			assert.Contains(t, lines[1], "no driver")
		} else {
			assert.Regexp(t, `^driver: +CUDA \d+\.\d+ `, lines[1])
		}
	}
	code, _, stderr := runCmd("version", "extra")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "takes no arguments")
}

func TestModuleVersionFallback(t *testing.T) {
	// Test binaries carry no module version: the fallback applies.
	assert.True(t, strings.HasPrefix(moduleVersion(), "(devel)") || strings.HasPrefix(moduleVersion(), "v"), moduleVersion())
}

// -h prints the command's usage to stdout and exits 0, for every command,
// whatever else is on the line.
func TestHelpForEveryCommand(t *testing.T) {
	for _, c := range commands {
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "-help"}, {c.name, "--help"}, {c.name, "-json", "-h"}} {
			if c.name != "info" && args[1] == "-json" {
				continue
			}
			code, stdout, stderr := runCmd(args...)
			assert.Equal(t, 0, code, "%v: %s", args, stderr)
			assert.Empty(t, stderr, args)
			assert.Contains(t, stdout, "usage: cudamem "+c.name, args)
			assert.NotContains(t, stdout, "Usage of", args)
		}
	}
	code, stdout, _ := runCmd("info", "-h")
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "-json")
	code, stdout, _ = runCmd("bench", "-h")
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "-iters")
	for _, h := range []string{"-h", "-help", "--help", "help"} {
		code, stdout, stderr := runCmd(h)
		assert.Equal(t, 0, code)
		assert.Empty(t, stderr)
		assert.Contains(t, stdout, "usage: cudamem")
		assert.Contains(t, stdout, "-version")
	}
}

// A bad flag exits 2 and prints its error once, to stderr.
func TestBadFlagExits2(t *testing.T) {
	for _, c := range commands {
		code, stdout, stderr := runCmd(c.name, "-no-such-flag")
		assert.Equal(t, 2, code, "%s: %s", c.name, stderr)
		assert.Empty(t, stdout, c.name)
		assert.Equal(t, 1, strings.Count(stderr, "flag provided but not defined: -no-such-flag"), "%s: %s", c.name, stderr)
	}
	code, _, stderr := runCmd("bench", "-iters", "lots")
	assert.Equal(t, 2, code)
	assert.Equal(t, 1, strings.Count(stderr, `invalid value "lots"`), stderr)
}

// noDriverSource is a machine without a driver.
type noDriverSource struct{ err error }

func (s noDriverSource) Driver() (string, int, error) { return "", 0, s.err }
func (s noDriverSource) Missing() ([]string, error)   { return nil, s.err }
func (s noDriverSource) Devices() ([]infoDevice, error) {
	return nil, s.err
}
func (s noDriverSource) CanAccessPeer(_, _ infoDevice) (bool, error) { return false, s.err }

func noDriver(fromEnv bool, paths ...string) error {
	le := &loader.LoadError{FromEnv: fromEnv}
	for _, p := range paths {
		le.Attempts = append(le.Attempts, loader.Attempt{Path: p, Err: fmt.Errorf("dlopen: %s: cannot open shared object file: No such file or directory", p)})
	}
	return fmt.Errorf("%w: %w", cuda.ErrNoDriver, le)
}

func TestInfoJSONWithoutDriver(t *testing.T) {
	withSource(t, noDriverSource{noDriver(false, "libcuda.so.1", "libcuda.so")})
	code, stdout, stderr := runCmd("info", "-json")
	assert.Equal(t, 1, code)
	var got InfoError
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	assert.True(t, got.NoDriver)
	assert.Contains(t, got.Error, "no CUDA driver")
	require.Len(t, got.Attempts, 2)
	assert.Equal(t, AttemptInfo{"libcuda.so.1", "cannot open shared object file: No such file or directory"}, got.Attempts[0])
	assert.Contains(t, got.Hint, "set CUDAMEM_DRIVER")
	assert.Contains(t, stderr, "no CUDA driver found")

	// Other failures before anything could be reported are JSON too.
	withSource(t, fakeSource{devsErr: &cuda.OpError{Op: "cuDeviceGetCount", Err: cuda.ErrorUnknown}})
	code, stdout, _ = runCmd("info", "-json")
	assert.Equal(t, 1, code)
	got = InfoError{}
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	assert.False(t, got.NoDriver)
	assert.Contains(t, got.Error, "cuDeviceGetCount")
}

// The CLI lists one attempt per line and suggests CUDAMEM_DRIVER only when
// it was not what chose the path.
func TestDescribeLoadError(t *testing.T) {
	withSource(t, noDriverSource{noDriver(false, "libcuda.so.1", "libcuda.so", "/usr/lib/wsl/lib/libcuda.so.1")})
	code, _, stderr := runCmd("info")
	assert.Equal(t, 1, code)
	assert.Equal(t, `cudamem info: no CUDA driver found
  tried libcuda.so.1: cannot open shared object file: No such file or directory
  tried libcuda.so: cannot open shared object file: No such file or directory
  tried /usr/lib/wsl/lib/libcuda.so.1: cannot open shared object file: No such file or directory
set CUDAMEM_DRIVER to the driver library's path to choose it
`, stderr)

	withSource(t, noDriverSource{noDriver(true, "/opt/nv/libcuda.so.1")})
	code, _, stderr = runCmd("info")
	assert.Equal(t, 1, code)
	assert.Equal(t, `cudamem info: no CUDA driver found
  tried /opt/nv/libcuda.so.1 (from CUDAMEM_DRIVER): cannot open shared object file: No such file or directory
CUDAMEM_DRIVER chose the path; unset it to search the default paths
`, stderr)
	assert.NotContains(t, stderr, "set CUDAMEM_DRIVER")

	err := describeLoadError(noDriver(false, "x"))
	assert.ErrorIs(t, err, cuda.ErrNoDriver, "the description still matches")
}
