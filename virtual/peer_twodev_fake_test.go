package virtual_test

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

// TestTwoDevicesVirtualFake: a resource made with a peer maps its growth
// for that peer (a kernel of device 1 writes device 0's memory, device 0
// checks it), Access reads the peer's access back from the driver,
// SetPeerAccess revokes it, and the resource's own device is refused as a
// peer; NCCLOptions with a peer gives the peer read-write access, read
// back from the driver.
func TestTwoDevicesVirtualFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestPeerAccessOnVMM", "TestGPUNCCLOptions")
}
