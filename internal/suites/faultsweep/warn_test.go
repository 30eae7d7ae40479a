//go:build cudamemfault && linux

package faultsweep

import (
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
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

// A graph lost without Close is destroyed by its safety net on the
// cleanup goroutine; when that cuGraphDestroy fails (injected), the
// failure is logged at Warn with the graph's handle and the driver's error.
func TestGraphSafetyNetFailureWarns(t *testing.T) {
	dev, err := device(0)
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Close()) }()
	log := testutil.CaptureSlog(t, slog.LevelWarn)
	addr := faultinject.Addr("cuGraphDestroy")
	require.NotZero(t, addr, "cuGraphDestroy resolved")
	leaks := cuda.GraphLeaks()
	func() {
		require.NoError(t, s.BeginCapture())
		g, err := s.EndCapture()
		require.NoError(t, err)
		_ = g // lost: never closed
	}()
	faultinject.FailEvery(addr, 999)
	defer faultinject.Reset()
	for range 300 {
		if cuda.GraphLeaks() > leaks {
			break
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, leaks+1, cuda.GraphLeaks(), "the safety net destroyed the lost graph")
	var lines []string
	for range 300 { // the cleanup logs after it counts
		if lines = log.Lines(); len(lines) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	require.Len(t, lines, 1)
	for _, want := range []string{"level=WARN", `op="graph safety net: cuGraphDestroy"`, "handle=0x", "CUDA_ERROR_UNKNOWN"} {
		assert.Contains(t, lines[0], want)
	}
}
