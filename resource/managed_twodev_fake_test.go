package resource_test

import (
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// TestManagedTwoDevicesFake runs the managed memory GPU tests on the fake
// driver's two devices: the fake keeps each page's advice and last
// prefetch location, so what the tests read back is what they set, and a
// discard scribbles over the memory, so a test that trusted discarded
// contents would fail.
func TestManagedTwoDevicesFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestGPUManagedPool", "TestGPUCurrentManagedPool", "TestGPUManagedBatches", "TestGPUManagedInstanceOps", "TestGPUManagedFromPointer",
		"TestGPUManagedBatchRefusals", "TestGPUManagedAdvice", "TestGPUManagedRejectNonManaged",
		"TestGPUManagedTwoDevices", "TestManaged")
}
