package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
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
	prof := filepath.Join(t.TempDir(), "bench.prof")
	code, stdout, stderr := runCmd("bench", "-only", "trivial", "-iters", "0.01", "-json", "-cgo", "/nonexistent/cgo-baseline", "-cpuprofile", prof)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, `"trivial/go"`)
	assert.Contains(t, stderr, "no C baseline")
	// The profile is one go tool pprof reads: a CPU profile.
	f, err := os.Open(prof)
	require.NoError(t, err)
	defer f.Close()
	p, err := profile.Parse(f)
	require.NoError(t, err)
	require.NotEmpty(t, p.SampleType)
	assert.Equal(t, "cpu", p.SampleType[len(p.SampleType)-1].Type)
}

func TestSelftest(t *testing.T) {
	cudatest.Device(t)
	code, stdout, stderr := runCmd("selftest")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "checks passed")
	assert.NotContains(t, stdout, "FAIL")
}

// failingDevice is a device whose every query fails, as on a machine whose
// driver loads but cannot talk to its GPUs.
type failingDevice struct{ ordinal int }

var errQuery = &cuda.OpError{Op: "cuDeviceGetAttribute", Err: cuda.ErrorUnknown}

func (d failingDevice) Ordinal() int                   { return d.ordinal }
func (d failingDevice) String() string                 { return fmt.Sprintf("GPU %d", d.ordinal) }
func (failingDevice) Name() (string, error)            { return "", errQuery }
func (failingDevice) UUID() (cuda.UUID, error)         { return cuda.UUID{}, errQuery }
func (failingDevice) PCIBusID() (string, error)        { return "", errQuery }
func (failingDevice) TotalMemory() (uint64, error)     { return 0, errQuery }
func (failingDevice) Features() (cuda.Features, error) { return cuda.Features{}, errQuery }
func (failingDevice) ComputeCapability() (int, int, error) {
	return 0, 0, errQuery
}

type fakeSource struct {
	devs    []infoDevice
	devsErr error
	peerErr error
}

func (fakeSource) Driver() (string, int, error)                  { return "/fake/libcuda.so.1", 13000, nil }
func (fakeSource) Missing() ([]string, error)                    { return nil, nil }
func (f fakeSource) Devices() ([]infoDevice, error)              { return f.devs, f.devsErr }
func (f fakeSource) CanAccessPeer(_, _ infoDevice) (bool, error) { return false, f.peerErr }

func withSource(t *testing.T, src infoSource) {
	t.Helper()
	saved := source
	source = src
	t.Cleanup(func() { source = saved })
}

// `cudamem info` exited 0 when every device query failed.
func TestInfoFailsWhenDeviceQueriesFail(t *testing.T) {
	withSource(t, fakeSource{devs: []infoDevice{failingDevice{0}, failingDevice{1}}, peerErr: errQuery})
	for _, args := range [][]string{{"info"}, {"info", "-json"}} {
		code, stdout, stderr := runCmd(args...)
		assert.Equal(t, 1, code, "%v: stdout:\n%s\nstderr:\n%s", args, stdout, stderr)
		assert.Contains(t, stderr, "device queries failed", args)
		assert.Contains(t, stderr, "GPU 0: name: cuDeviceGetAttribute: CUDA_ERROR_UNKNOWN", args)
		assert.Contains(t, stderr, "GPU 1: features:", args)
		assert.Contains(t, stderr, "peer GPU 1", args)
		assert.NotEmpty(t, stdout, "what could be read is still printed")
	}
}

// One failed query is enough to fail; none is success.
func TestInfoExitStatusFollowsQueries(t *testing.T) {
	withSource(t, fakeSource{devs: []infoDevice{failingDevice{0}}})
	code, _, stderr := runCmd("info")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "GPU 0: uuid:")

	withSource(t, fakeSource{devsErr: &cuda.OpError{Op: "cuDeviceGetCount", Err: cuda.ErrorUnknown}})
	code, _, stderr = runCmd("info")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "listing its devices failed")
	assert.Contains(t, stderr, "cuDeviceGetCount")

	withSource(t, fakeSource{})
	code, stdout, stderr := runCmd("info")
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "devices: 0")
}
