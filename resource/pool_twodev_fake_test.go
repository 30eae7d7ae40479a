package resource_test

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

// TestTwoDevicesPoolsFake: peer access on an owned pool (granted, read
// back through PeerAccess and the pool's own query, a kernel of device 1
// writing device 0's pool memory, revoked, revoked by Close, not cached
// between two resources on the current pool), and a pool refusing a
// stream of the other device; SetDefault refusing a resource of the
// other device.
func TestTwoDevicesPoolsFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestDevicePoolPeerAccess", "TestDevicePoolOtherDeviceStream", "TestDefault")
}
