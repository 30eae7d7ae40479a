package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/cuda/cudatest"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsage(t *testing.T) {
	code, _, stderr := runCmd()
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "usage: cudamem")
	code, _, stderr = runCmd("frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `unknown command "frobnicate"`)
	code, stdout, _ := runCmd("help")
	assert.Equal(t, 0, code)
	assert.Contains(t, stdout, "info")
	code, _, stderr = runCmd("info", "extra")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "takes no arguments")
}

func TestInfo(t *testing.T) {
	_, _, drvErr := cuda.Driver()
	code, stdout, stderr := runCmd("info")
	if drvErr != nil {
		if cudatest.Required() {
			t.Fatalf("GPU required: %v", drvErr)
		}
		// No driver: say what was tried, exit 1, no stack trace.
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "no CUDA driver")
		assert.NotContains(t, stderr, "goroutine")
		if os.Getenv("CUDAMEM_DRIVER") == "" {
			assert.Contains(t, stderr, "tried libcuda.so.1")
		}
		return
	}
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "GPU 0:")
	assert.Contains(t, stdout, "memory pools:")

	code, stdout, stderr = runCmd("info", "-json")
	require.Equal(t, 0, code, stderr)
	var info Info
	require.NoError(t, json.Unmarshal([]byte(stdout), &info))
	n, err := cuda.DeviceCount()
	require.NoError(t, err)
	require.Len(t, info.Devices, n)
	assert.NotEmpty(t, info.Devices[0].Name)
	assert.Regexp(t, `^GPU-[0-9a-f-]{36}$`, info.Devices[0].UUID)
	assert.Greater(t, info.Devices[0].TotalMemory, uint64(0))
	if n >= 2 {
		t.Logf("peers of GPU 0: %v", info.Devices[0].Peers)
	}
}

func TestBenchSmoke(t *testing.T) {
	cudatest.Device(t)
	code, stdout, stderr := runCmd("bench", "-only", "trivial", "-iters", "0.01", "-json", "-cgo", "/nonexistent/cgo-baseline")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, `"trivial/go"`)
	assert.Contains(t, stderr, "no C baseline")
}

func TestEmbeddedKernelsMatchTestdata(t *testing.T) {
	want, err := os.ReadFile("../../testdata/kernels.ptx")
	require.NoError(t, err)
	assert.Equal(t, string(want), string(kernels), "cmd/cudamem/kernels.ptx must be a copy of testdata/kernels.ptx")
}

func TestSelftest(t *testing.T) {
	cudatest.Device(t)
	code, stdout, stderr := runCmd("selftest")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "checks passed")
	assert.NotContains(t, stdout, "FAIL")
}
