//go:build linux

package capturesweep

import (
	"os"
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// fake is the fake driver the sweep runs on, nil on a GPU machine.
var fake *fakecuda.Driver

// TestMain runs the sweep on the real driver where a GPU is required
// (CUDAMEM_REQUIRE_GPU=1, as on the GPU machine), and otherwise on the
// fake driver, which models the driver's capture rules (joining by event
// wait, isolation, cuCtxSynchronize during capture, captured events,
// uncapturable batched copies) and counts every object it hands out.
func TestMain(m *testing.M) {
	if os.Getenv(cudatest.EnvRequireGPU) == "1" {
		os.Exit(m.Run())
	}
	fakecuda.Main(m, "capturesweep", &fake)
}

// The sweep on the fake driver, whose driver objects are all counted back
// to their baseline, or on the GPU, where every refusal must leave the
// capture valid (EndCapture succeeds) and every allowed operation must be
// captured or run without invalidating it; buffers must not leak.
func TestCaptureSweep(t *testing.T) {
	var c Checks
	if fake != nil {
		c.Baseline = func(t *testing.T) func() {
			before := fake.Snapshot()
			return func() {
				t.Helper()
				now := fake.Snapshot()
				now[fakecuda.CtxRetains] = before[fakecuda.CtxRetains]
				if d := now.Diff(before); d != "" {
					t.Errorf("fake driver counters changed: %s", d)
				}
			}
		}
		c.Pools = func() int64 { return fake.Snapshot()[fakecuda.Pools] }
	}
	Run(t, cudatest.Device(t), c)
}
