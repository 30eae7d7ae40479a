package capturesweep_test

import (
	"testing"

	"github.com/cudamem/cudamem/internal/capturesweep"
	"github.com/cudamem/cudamem/internal/cudatest"
)

// GPU: the capture sweep on the real driver. Every refusal must leave the
// capture valid (EndCapture succeeds) and every allowed operation must be
// captured or run without invalidating it; buffers must not leak.
func TestGPUCaptureSweep(t *testing.T) {
	capturesweep.Run(t, cudatest.Device(t), capturesweep.Checks{})
}
