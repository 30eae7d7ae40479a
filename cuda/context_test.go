package cuda

import (
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCallMakesContextCurrent checks the mechanism behind the context
// model: a context-needing call makes the device's primary context current
// on the OS thread that ran it, whatever was current there before.
func TestCallMakesContextCurrent(t *testing.T) {
	ds, err := devices()
	if err != nil || len(ds) == 0 {
		if os.Getenv("CUDAMEM_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %v (%d devices)", err, len(ds))
		}
		t.Skipf("no GPU: %v", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, d := range append(ds, ds[0]) { // visit every device, then switch back
		// Start from no context at all on this thread.
		require.True(t, ok(d.drv.CtxSetCurrent.Call(0)))
		cur, err := currentContext(d)
		require.NoError(t, err)
		require.Zero(t, cur)
		_, _, err = d.MemInfo()
		require.NoError(t, err)
		cur, err = currentContext(d)
		require.NoError(t, err)
		ctx, err := d.context()
		require.NoError(t, err)
		assert.Equal(t, ctx, cur, "%v's primary context is current after a call on it", d)
	}
}
