package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cmd/cudamem/internal/trace"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// On the driver this process loads (a GPU's where there is one; skipped
// without), each resource replays a small serving trace: the trace's
// peak and counts, at least the live bytes held at the peak, nothing
// held after Trim.
func TestReplayGPU(t *testing.T) {
	cudatest.Device(t)
	ops, err := trace.Generate("serving", 1, 40)
	require.NoError(t, err)
	want := trace.Summarize(ops)
	for _, res := range replayResources {
		code, stdout, stderr := runCmd("replay", "-resource", res, "-steps", "40", "-json")
		require.Equal(t, 0, code, "%s: %s", res, stderr)
		var rep replayReport
		require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
		assert.Equal(t, want.PeakLive, rep.PeakLive, res)
		assert.Equal(t, want.Allocations, rep.Allocations, res)
		assert.Equal(t, want.Frees, rep.Frees, res)
		assert.GreaterOrEqual(t, rep.PeakReserved, rep.PeakLive, res)
		if rep.ReservedAfterTrim != nil {
			assert.Zero(t, *rep.ReservedAfterTrim, res)
		}
		t.Logf("%s: peak live %d, peak reserved %d (%.3fx), at end %d, mean Allocate %.0f ns, device free %d -> %d",
			res, rep.PeakLive, rep.PeakReserved, rep.Ratio, rep.ReservedAtEnd, rep.MeanAllocNs, rep.DeviceFreeBefore, rep.DeviceFreeAfter)
	}
}
