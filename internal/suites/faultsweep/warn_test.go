//go:build cudamemfault

package faultsweep

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/faultinject"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/resource"
)

// A pool closed with a buffer live is destroyed by the buffer's Close, a
// free that succeeded and so returns nil. When that destruction fails
// (cuMemPoolDestroy failing, injected), nobody would hear of it but a
// later Close: it is logged at Warn, naming the operation, the pool and
// the driver's error, and the next Close destroys the pool.
func TestDeferredPoolDestroyFailureWarns(t *testing.T) {
	dev, err := device(0)
	require.NoError(t, err)
	log := testutil.CaptureSlog(t, slog.LevelWarn)
	closeLast := func(failAt int64) (calls []string, pool *resource.DevicePool) {
		pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
		require.NoError(t, err)
		b, err := pool.Allocate(1<<20, nil)
		require.NoError(t, err)
		require.NoError(t, pool.Close(), "deferred: a buffer is live")
		if failAt == 0 {
			return trace(t, b.Close), pool
		}
		faultinject.FailCall(failAt, 999)
		defer faultinject.Reset()
		require.NoError(t, b.Close(), "the free itself succeeds")
		return nil, pool
	}
	calls, _ := closeLast(0)
	at := slices.Index(calls, "cuMemPoolDestroy")
	require.GreaterOrEqual(t, at, 0, "the last Close destroys the pool: %v", calls)
	require.Empty(t, log.Lines(), "a destruction that worked")

	_, pool := closeLast(int64(at + 1))
	lines := log.Lines()
	require.Len(t, lines, 1, "one warning")
	for _, want := range []string{"level=WARN", `op="deferred pool destruction"`, "pool=\"DevicePool 0x", "cuMemPoolDestroy", "CUDA_ERROR_UNKNOWN"} {
		assert.Contains(t, lines[0], want)
	}
	err = pool.Close()
	require.NoError(t, err, "Close retries the destruction")
	assert.True(t, strings.Contains(lines[0], dev.String()), "names the device: %s", lines[0])
}
