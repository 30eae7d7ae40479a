package cuda_test

// The package's two-GPU tests, run on the fake driver's two devices
// (internal/testkit/fakecuda) in a child process, so that the peer-access and
// other-device paths run on machines with one GPU or none. The fake runs
// the test kernels on the host, so each GPU test runs unchanged: data
// written by one device and checked by the other, access read back from
// the driver, refusals matched with errors.Is.

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// twoDevChildEnv marks the child process that runs GPU tests over the
// fake driver.
const twoDevChildEnv = "CUDAMEM_CUDA_TWODEV_CHILD"

// runOnTwoFakeDevices runs the named GPU tests (top-level test functions)
// in a child process over the fake driver with two devices, and fails
// unless each passed with none of its subtests skipped: on the fake
// nothing a second GPU would provide is missing. In the child it skips
// (the GPU tests run there by name, not this one).
func runOnTwoFakeDevices(t *testing.T, tests ...string) {
	t.Helper()
	if os.Getenv(twoDevChildEnv) == "1" {
		t.Skip("in the child over the fake driver")
	}
	path, err := fakecuda.Build(t.TempDir())
	if errors.Is(err, fakecuda.ErrNoCompiler) && !fakecuda.Required() {
		t.Skipf("the fake driver needs a C compiler: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^("+strings.Join(tests, "|")+")$", "-test.count=1", "-test.v", "-test.timeout=5m")
	// CUDAMEM_REQUIRE_GPU: a driver that fails to load fails the tests.
	cmd.Env = append(os.Environ(), twoDevChildEnv+"=1", "CUDAMEM_DRIVER="+path, "FAKECUDA_DEVICES=2", "CUDAMEM_REQUIRE_GPU=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("over the fake driver's two devices: %v\n%s", err, out)
	}
	for _, name := range tests {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass over the fake driver's two devices", name)
		}
	}
	if skips := regexp.MustCompile(`--- SKIP: .*`).FindAllString(string(out), -1); len(skips) > 0 {
		t.Errorf("skipped over the fake driver's two devices: %s", strings.Join(skips, "; "))
	}
	t.Logf("the child over the fake driver's two devices said:\n%s", out)
}

// TestTwoDevicesCudaFake: a stream of the second device that joins a
// capture by a wait makes that device's Sync refused until the capture
// ends; driver calls from many goroutines on both devices run in their
// own device's context; a kernel of device 0 launched on a stream of
// device 1 is refused.
func TestTwoDevicesCudaFake(t *testing.T) {
	runOnTwoFakeDevices(t, "TestCaptureJoinedFromAnotherDeviceGPU", "TestContextStress", "TestLiveHandlesRefuseZeroAndClosed")
}
