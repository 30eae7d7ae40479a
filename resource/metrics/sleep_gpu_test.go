package metrics_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource/metrics"
	"github.com/cudamem/cudamem/virtual"
)

func TestSleepMetricsFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestGPUSleepMetrics")
}

// TestGPUSleepMetrics puts one tag of two to sleep and scrapes: the
// sleeping tag's bytes, allocations and counts are its SleepStats, one
// sample per tag, in the Prometheus text and the expvar JSON.
func TestGPUSleepMetrics(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	r, err := virtual.New(d, &virtual.Options{Tag: "weights"})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	w, err := r.Allocate(3*r.Granularity(), s)
	require.NoError(t, err)
	kv, err := r.AllocateTagged(`kv "cache"`, 100, s)
	require.NoError(t, err)
	defer func() { assert.NoError(t, w.Close()); assert.NoError(t, kv.Close()) }()
	reg := new(metrics.Registry)
	require.NoError(t, reg.AddSleep("vmm", r))
	require.Error(t, reg.AddSleep("nil", nil))
	require.NoError(t, r.Sleep(&virtual.SleepOptions{Backup: virtual.BackupToHost}))
	require.NoError(t, r.Wake(nil, `kv "cache"`))
	e := scrape(t, reg)
	tagged := func(name, tag string) float64 {
		for _, smp := range e.samples {
			if smp.name == name && smp.labels["resource"] == "vmm" && smp.labels["tag"] == tag {
				return smp.value
			}
		}
		t.Fatalf("no sample %s{tag=%q} in %+v", name, tag, e.samples)
		return 0
	}
	assert.Equal(t, float64(3*r.Granularity()), tagged("cudamem_sleep_asleep_bytes", "weights"))
	assert.Equal(t, 1.0, tagged("cudamem_sleep_asleep_allocations", "weights"))
	assert.Equal(t, float64(3*r.Granularity()), tagged("cudamem_sleep_backup_bytes", "weights"))
	assert.Equal(t, 0.0, tagged("cudamem_sleep_asleep_bytes", `kv "cache"`))
	assert.Equal(t, 1.0, tagged("cudamem_sleeps_total", `kv "cache"`))
	assert.Equal(t, 1.0, tagged("cudamem_wakes_total", `kv "cache"`))
	assert.Equal(t, 0.0, tagged("cudamem_wakes_total", "weights"))
	var sn metrics.Snapshot
	require.NoError(t, json.Unmarshal([]byte(reg.String()), &sn))
	assert.Equal(t, r.SleepStats(), sn.Sleep["vmm"])
	require.NoError(t, r.Wake(nil))
	require.NoError(t, r.DropHostBackup())
}
