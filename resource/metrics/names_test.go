package metrics_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/metrics"
)

// familyClashes reads the "# TYPE" lines of an exposition and returns
// the names that are not unique under the classic text format (the
// family is the metric name) and under OpenMetrics, where a counter's
// family is its name without "_total" and its samples are FAMILY_total:
// two families of one name, or two families whose samples share a name
// (a gauge "x_total" beside a counter "x"), are both refused.
func familyClashes(t *testing.T, text string) (classic, openMetrics []string) {
	t.Helper()
	seen := map[string]bool{}
	families := map[string][]string{} // OpenMetrics family -> metric names
	samples := map[string][]string{}  // OpenMetrics sample name -> metric names
	var order []string
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, "# TYPE ")
		if !ok {
			continue
		}
		name, typ, ok := strings.Cut(rest, " ")
		require.True(t, ok, line)
		if seen[name] {
			classic = append(classic, name)
		}
		seen[name] = true
		order = append(order, name)
		family, sample := name, name
		if typ == "counter" {
			family = strings.TrimSuffix(name, "_total")
			sample = family + "_total"
		}
		families[family] = append(families[family], name)
		samples[sample] = append(samples[sample], name)
	}
	require.NotEmpty(t, order, "no # TYPE lines in:\n%s", text)
	for _, name := range order {
		for what, m := range map[string]map[string][]string{"family": families, "sample": samples} {
			for key, names := range m {
				if len(names) > 1 && names[0] == name {
					openMetrics = append(openMetrics, what+" "+key+": "+strings.Join(names, ", "))
				}
			}
		}
	}
	return classic, openMetrics
}

// The checker itself: the names this package used to serve (a gauge
// cudamem_allocated_bytes beside the counter cudamem_allocated_bytes_total)
// are two families of one name under OpenMetrics; a gauge x_total beside
// a counter x share a sample name.
func TestFamilyClashesFindsTheOldNames(t *testing.T) {
	old := "# TYPE cudamem_allocated_bytes gauge\n" +
		"# TYPE cudamem_allocated_bytes_total counter\n" +
		"# TYPE cudamem_allocations gauge\n" +
		"# TYPE cudamem_allocations_total counter\n"
	classic, om := familyClashes(t, old)
	assert.Empty(t, classic, "unique under the classic rule")
	assert.ElementsMatch(t, []string{
		"family cudamem_allocated_bytes: cudamem_allocated_bytes, cudamem_allocated_bytes_total",
		"family cudamem_allocations: cudamem_allocations, cudamem_allocations_total",
	}, om)

	classic, om = familyClashes(t, "# TYPE x_total gauge\n# TYPE x counter\n")
	assert.Empty(t, classic)
	assert.Equal(t, []string{"sample x_total: x_total, x"}, om)

	classic, _ = familyClashes(t, "# TYPE a gauge\n# TYPE a gauge\n")
	assert.Equal(t, []string{"a"}, classic)
}

// Every family this package serves, with every kind of source registered,
// is unique under both formats.
func TestFamilyNamesUnique(t *testing.T) {
	up := &fakeUpstream{}
	stats := resource.NewStatistics(up)
	sa, err := resource.NewSubAllocator(&fakeUpstream{}, &resource.SubAllocatorOptions{GrowSize: 1 << 20})
	require.NoError(t, err)
	reg := new(metrics.Registry)
	require.NoError(t, reg.AddStatistics("stats", stats))
	require.NoError(t, reg.AddSubAllocator("sub", sa))
	require.NoError(t, reg.AddPool("pool", &fakePool{}))
	require.NoError(t, reg.AddPool("broken", &fakePool{err: cuda.Errorf("fake", cuda.ErrClosed, "closed")}))
	b, err := sa.Allocate(4096, nil)
	require.NoError(t, err)
	defer b.Close()

	var sb strings.Builder
	require.NoError(t, reg.WritePrometheus(&sb))
	text := sb.String()
	parseExposition(t, text) // and well-formed
	classic, om := familyClashes(t, text)
	assert.Empty(t, classic, "families served twice (classic text format)")
	assert.Empty(t, om, "families served twice under OpenMetrics")
	// Every kind of source showed up, so every family was checked.
	for _, name := range []string{"cudamem_live_bytes", "cudamem_allocated_bytes_total", "cudamem_pool_used_bytes", "cudamem_suballocator_allocations", "cudamem_source_up"} {
		assert.Contains(t, text, "# TYPE "+name+" ", name)
	}
	assert.Equal(t, 19, strings.Count(text, "# TYPE "), "every family once")
}
