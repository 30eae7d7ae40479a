package cuda_test

// The package's two-GPU tests, run on the fake driver's two devices
// (internal/testkit/fakecuda) in a child process, so that the peer-access and
// other-device paths run on machines with one GPU or none. The fake runs
// the test kernels on the host, so each GPU test runs unchanged: data
// written by one device and checked by the other, access read back from
// the driver, refusals matched with errors.Is.

import (
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// TestTwoDevicesCudaFake: a stream of the second device that joins a
// capture by a wait makes that device's Sync refused until the capture
// ends; driver calls from many goroutines on both devices run in their
// own device's context; a kernel of device 0 launched on a stream of
// device 1 is refused.
func TestTwoDevicesCudaFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestCaptureJoinedFromAnotherDeviceGPU", "TestContextStress", "TestLiveHandlesRefuseZeroAndClosed")
}
