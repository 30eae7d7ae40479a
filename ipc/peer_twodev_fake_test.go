//go:build linux

package ipc_test

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

// TestTwoDevicesIpcFake: a child process imports a pool of device 0,
// grants device 1 access to the imported pool, and checks and rewrites
// the buffer with kernels of device 1; the parent checks the rewrite.
func TestTwoDevicesIpcFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestIpcPeerAccess")
}
