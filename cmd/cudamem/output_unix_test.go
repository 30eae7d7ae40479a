//go:build unix

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A command stopped by an interrupt or SIGTERM while its outputs are open
// removes their temporary files: no partial output is left. The command
// is held where it waits for its input, a FIFO with no writer, with its
// outputs already open.
func TestInterruptLeavesNoPartialOutput(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		dir := t.TempDir()
		fifo := filepath.Join(dir, "in.json")
		require.NoError(t, syscall.Mkfifo(fifo, 0o600))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "old.svg"), []byte("old"), 0o644))
		exe, err := os.Executable()
		require.NoError(t, err)
		cmd := exec.Command(exe, "timeline", "-in", fifo, "-o", "old.svg", "-json", "new.json")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), envRunCLI+"=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Start())
		// Wait for both temporary files: the outputs are open, the
		// command blocks opening the FIFO.
		for deadline := time.Now().Add(time.Minute); ; {
			if len(dirNames(t, dir)) == 4 {
				break
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				t.Fatalf("the outputs were never opened: %v (stderr %q)", dirNames(t, dir), stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		require.NoError(t, cmd.Process.Signal(sig))
		err = cmd.Wait()
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "%v", err)
		assert.Equal(t, 128+int(sig), ee.ExitCode(), sig)
		assert.Equal(t, "cudamem: "+sig.String()+": stopped; no partial output is left\n", stderr.String())
		assert.Equal(t, []string{"in.json", "old.svg"}, dirNames(t, dir), sig)
		data, err := os.ReadFile(filepath.Join(dir, "old.svg"))
		require.NoError(t, err)
		assert.Equal(t, "old", string(data))
	}
}

// With an output on standard output, the one-line summary goes to stderr,
// so that what is on stdout is the output alone.
func TestTimelineSummaryKeepsOffStdout(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "t.json")
	writeTrace(t, in)
	code, stdout, stderr := runCmd("timeline", "-in", in, "-o", filepath.Join(dir, "x.svg"), "-json", "-")
	require.Equal(t, 0, code, stderr)
	assert.True(t, strings.HasPrefix(stdout, `{"version":1`), "%.40q", stdout)
	assert.NotContains(t, stdout, "45 events")
	assert.Contains(t, stderr, "x.svg: 45 events")
	code, stdout, stderr = runCmd("timeline", "-in", in, "-o", filepath.Join(dir, "x.svg"))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "x.svg: 45 events")
}
