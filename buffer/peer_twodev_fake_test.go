package buffer_test

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

// TestTwoDevicesBufferFake: peer copies between buffers of the two
// devices (on either device's stream, views at odd offsets, the nil
// stream), each checked by a kernel of the destination device and read
// back to the host; a CopyBatch with a buffer of the other device refused
// before anything is submitted; concurrent staged host copies on both
// devices.
func TestTwoDevicesBufferFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestBufferPeerCopy", "TestGPUCopyBatchWrongDevice", "TestCopyHostConcurrent")
}
