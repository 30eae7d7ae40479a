package metrics_test

import (
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/metrics"
)

// fakeUpstream hands out made-up addresses and can be told to fail.
type fakeUpstream struct {
	mu   sync.Mutex
	next cuda.DevicePtr
	fail int
	dev  int
}

func (f *fakeUpstream) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return 0, nil, &cuda.OpError{Op: "fake.Allocate", Err: cuda.ErrorOutOfMemory}
	}
	if f.next == 0 {
		f.next = 0x7f0000000000
	}
	if size == 0 {
		return 0, s, nil
	}
	p := f.next
	f.next += cuda.DevicePtr((size + 255) &^ 255)
	return p, s, nil
}
func (f *fakeUpstream) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (f *fakeUpstream) DeviceAccessible() bool                                { return true }
func (f *fakeUpstream) HostAccessible() bool                                  { return false }
func (f *fakeUpstream) DeviceID() int                                         { return f.dev }

// fakePool is a PoolSource with set attributes, or an error.
type fakePool struct {
	attrs resource.PoolAttributes
	err   error
}

func (p *fakePool) Attributes() (resource.PoolAttributes, error) { return p.attrs, p.err }
func (p *fakePool) DeviceID() int                                { return 1 }

// sample is one parsed sample line.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// exposition is a parsed Prometheus text page.
type exposition struct {
	help, typ map[string]string
	samples   []sample
}

// get returns the value of name for resource res, and whether there is one.
func (e exposition) get(name, res string) (float64, bool) {
	for _, s := range e.samples {
		if s.name == name && s.labels["resource"] == res {
			return s.value, true
		}
	}
	return 0, false
}

// parseExposition parses the text format strictly enough to catch what a
// Prometheus server would reject: HELP and TYPE once per family and
// before its samples, a family's samples together, known types, label
// syntax and escapes, numeric values.
func parseExposition(t *testing.T, text string) exposition {
	t.Helper()
	e := exposition{help: map[string]string{}, typ: map[string]string{}}
	done := map[string]bool{} // families whose samples ended
	current := ""
	require.True(t, strings.HasSuffix(text, "\n") || text == "", "the page ends with a line feed")
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" && text == "" {
			continue
		}
		where := fmt.Sprintf("line %d %q", i+1, line)
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, help, ok := strings.Cut(rest, " ")
			require.True(t, ok, where)
			require.NotContains(t, e.help, name, "HELP twice: "+where)
			e.help[name] = unescape(t, help, false)
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, ok := strings.Cut(rest, " ")
			require.True(t, ok, where)
			require.NotContains(t, e.typ, name, "TYPE twice: "+where)
			require.Contains(t, []string{"counter", "gauge", "histogram", "summary", "untyped"}, typ, where)
			e.typ[name] = typ
			continue
		}
		require.False(t, strings.HasPrefix(line, "#"), where)
		s := parseSample(t, line)
		require.Contains(t, e.typ, s.name, "sample before its TYPE: "+where)
		require.Contains(t, e.help, s.name, "sample without HELP: "+where)
		if s.name != current {
			require.False(t, done[s.name], "family split: "+where)
			if current != "" {
				done[current] = true
			}
			current = s.name
		}
		if e.typ[s.name] == "counter" {
			require.True(t, strings.HasSuffix(s.name, "_total"), "counter names end in _total: "+where)
		}
		e.samples = append(e.samples, s)
	}
	return e
}

func parseSample(t *testing.T, line string) sample {
	t.Helper()
	s := sample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	require.Positive(t, i, line)
	s.name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for rest[0] != '}' {
			k, after, ok := strings.Cut(rest, `="`)
			require.True(t, ok, line)
			// The value runs to the first unescaped quote.
			j := 0
			for ; j < len(after) && after[j] != '"'; j++ {
				if after[j] == '\\' {
					j++
				}
			}
			require.Less(t, j, len(after), line)
			s.labels[k] = unescape(t, after[:j], true)
			rest = after[j+1:]
			if rest[0] == ',' {
				rest = rest[1:]
			}
		}
		rest = rest[1:]
	}
	v, ok := strings.CutPrefix(rest, " ")
	require.True(t, ok, line)
	f, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err, line)
	s.value = f
	return s
}

// unescape undoes the text format's escapes: \\ and \n, and \" in label
// values. Any other escape is an error.
func unescape(t *testing.T, s string, label bool) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			require.False(t, label && c == '"', "unescaped quote in %q", s)
			require.NotEqual(t, byte('\n'), c)
			b.WriteByte(c)
			continue
		}
		i++
		require.Less(t, i, len(s), "trailing backslash in %q", s)
		switch s[i] {
		case '\\':
			b.WriteByte('\\')
		case 'n':
			b.WriteByte('\n')
		case '"':
			require.True(t, label, "\\\" in HELP text %q", s)
			b.WriteByte('"')
		default:
			t.Fatalf("bad escape \\%c in %q", s[i], s)
		}
	}
	return b.String()
}

func scrape(t *testing.T, reg *metrics.Registry) exposition {
	t.Helper()
	var sb strings.Builder
	require.NoError(t, reg.WritePrometheus(&sb))
	return parseExposition(t, sb.String())
}

// workload allocates and frees through mr, leaving some live, with one
// upstream failure; it returns the live buffers.
func workload(t *testing.T, mr buffer.MemoryResource, up *fakeUpstream) []*buffer.Buffer {
	t.Helper()
	var live []*buffer.Buffer
	for i := range 20 {
		b, err := buffer.Allocate(mr, uint64(1000*(i+1)), nil)
		require.NoError(t, err)
		if i%3 == 0 {
			require.NoError(t, b.Close())
		} else {
			live = append(live, b)
		}
	}
	up.mu.Lock()
	up.fail = 1
	up.mu.Unlock()
	_, err := buffer.Allocate(mr, 4<<20, nil) // more than a sub-allocator holds free
	require.Error(t, err)
	return live
}

func closeAll(t *testing.T, bufs []*buffer.Buffer) {
	for _, b := range bufs {
		require.NoError(t, b.Close())
	}
}

func TestPrometheusStatistics(t *testing.T) {
	up := &fakeUpstream{dev: 3}
	stats := resource.NewStatistics(up)
	reg := metrics.NewRegistry()
	require.NoError(t, reg.AddStatistics("model", stats))
	live := workload(t, stats, up)
	closeAll(t, live[:4])
	defer closeAll(t, live[4:])

	st := stats.Stats()
	e := scrape(t, reg)
	want := map[string]uint64{
		"cudamem_live_bytes":                st.CurrentBytes,
		"cudamem_live_bytes_peak":           st.PeakBytes,
		"cudamem_live_allocations":          st.CurrentCount,
		"cudamem_live_allocations_peak":     st.PeakCount,
		"cudamem_allocated_bytes_total":     st.TotalBytes,
		"cudamem_allocations_total":         st.TotalCount,
		"cudamem_allocation_failures_total": st.Failures,
		"cudamem_source_up":                 1,
	}
	require.Len(t, e.samples, len(want), "one sample per metric for one source")
	for name, v := range want {
		got, ok := e.get(name, "model")
		if assert.True(t, ok, name) {
			assert.Equal(t, float64(v), got, name)
		}
	}
	for _, s := range e.samples {
		assert.Equal(t, "3", s.labels["device"], s.name)
	}
	assert.Equal(t, "counter", e.typ["cudamem_allocations_total"])
	assert.Equal(t, "gauge", e.typ["cudamem_live_bytes"])
	assert.Equal(t, uint64(1), st.Failures)
	assert.NotZero(t, st.CurrentBytes)
	assert.Greater(t, st.PeakBytes, st.CurrentBytes)
}

func TestPrometheusPoolsAndSubAllocators(t *testing.T) {
	up := &fakeUpstream{dev: 2}
	sa, err := resource.NewSubAllocator(up, &resource.SubAllocatorOptions{GrowSize: 1 << 20})
	require.NoError(t, err)
	// Not closed: giving its blocks back waits for the default stream,
	// which needs a driver. The fake's blocks are only numbers.
	pool := &fakePool{attrs: resource.PoolAttributes{
		ReleaseThreshold: ^uint64(0), ReservedMemCurrent: 64 << 20, ReservedMemHigh: 96 << 20,
		UsedMemCurrent: 10 << 20, UsedMemHigh: 50 << 20,
	}}
	broken := &fakePool{err: cuda.Errorf("fake.Attributes", cuda.ErrClosed, "closed")}

	reg := new(metrics.Registry)
	require.NoError(t, reg.AddSubAllocator("sub", sa))
	require.NoError(t, reg.AddPool("pool", pool))
	require.NoError(t, reg.AddPool("broken", broken))
	assert.Equal(t, []string{"broken", "pool", "sub"}, reg.Names())

	live := workload(t, sa, up)
	defer closeAll(t, live)
	ss := sa.Stats()
	e := scrape(t, reg)
	for name, v := range map[string]uint64{
		"cudamem_suballocator_reserved_bytes": ss.Reserved,
		"cudamem_suballocator_used_bytes":     ss.Used,
		"cudamem_suballocator_free_bytes":     ss.Free,
		"cudamem_suballocator_blocks":         uint64(ss.Blocks),
		"cudamem_suballocator_allocations":    uint64(ss.Allocations),
		"cudamem_suballocator_free_ranges":    uint64(ss.FreeRanges),
	} {
		got, ok := e.get(name, "sub")
		if assert.True(t, ok, name) {
			assert.Equal(t, float64(v), got, name)
		}
	}
	for name, v := range map[string]uint64{
		"cudamem_pool_reserved_bytes":          pool.attrs.ReservedMemCurrent,
		"cudamem_pool_reserved_bytes_high":     pool.attrs.ReservedMemHigh,
		"cudamem_pool_used_bytes":              pool.attrs.UsedMemCurrent,
		"cudamem_pool_used_bytes_high":         pool.attrs.UsedMemHigh,
		"cudamem_pool_release_threshold_bytes": pool.attrs.ReleaseThreshold,
	} {
		got, ok := e.get(name, "pool")
		if assert.True(t, ok, name) {
			assert.Equal(t, float64(v), got, name)
		}
		_, ok = e.get(name, "broken")
		assert.False(t, ok, "no samples for a source that failed: %s", name)
	}
	upv, _ := e.get("cudamem_source_up", "broken")
	assert.Zero(t, upv)
	upv, _ = e.get("cudamem_source_up", "pool")
	assert.Equal(t, 1.0, upv)
	for _, s := range e.samples {
		if s.labels["resource"] == "sub" {
			assert.Equal(t, "2", s.labels["device"])
		}
	}

	// The same values in the expvar JSON.
	var sn metrics.Snapshot
	require.NoError(t, json.Unmarshal([]byte(reg.String()), &sn))
	assert.Equal(t, ss, sn.SubAllocators["sub"])
	assert.Equal(t, pool.attrs, sn.Pools["pool"])
	assert.Contains(t, sn.Errors["broken"], "closed")
	assert.Equal(t, map[string]int{"sub": 2, "pool": 1, "broken": 1}, sn.Devices)
}

// TestPrometheusEscaping: names with quotes, backslashes, line feeds and
// invalid UTF-8 come back from the page as given (invalid bytes as U+FFFD).
func TestPrometheusEscaping(t *testing.T) {
	reg := new(metrics.Registry)
	names := []string{`a"b`, `c\d`, "e\nf", `\"` + "\n\\", "ünï", "bad\xffutf8"}
	for _, n := range names {
		require.NoError(t, reg.AddStatistics(n, resource.NewStatistics(&fakeUpstream{})))
	}
	e := scrape(t, reg)
	seen := map[string]bool{}
	for _, s := range e.samples {
		seen[s.labels["resource"]] = true
	}
	for _, n := range names {
		assert.True(t, seen[strings.ToValidUTF8(n, "\uFFFD")], "%q", n)
	}
}

func TestExpvar(t *testing.T) {
	up := &fakeUpstream{}
	stats := resource.NewStatistics(up)
	reg := new(metrics.Registry)
	require.NoError(t, reg.AddStatistics("s", stats))
	expvar.Publish("cudamem_test_expvar", reg)
	live := workload(t, stats, up)
	defer closeAll(t, live)

	var sn metrics.Snapshot
	require.NoError(t, json.Unmarshal([]byte(expvar.Get("cudamem_test_expvar").String()), &sn))
	assert.Equal(t, stats.Stats(), sn.Statistics["s"])

	// And through expvar's own handler, as /debug/vars serves it.
	rec := httptest.NewRecorder()
	expvar.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/vars", nil))
	var all map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &all))
	require.Contains(t, all, "cudamem_test_expvar")
	sn = metrics.Snapshot{}
	require.NoError(t, json.Unmarshal(all["cudamem_test_expvar"], &sn))
	assert.Equal(t, stats.Stats(), sn.Statistics["s"])
}

func TestHTTPHandler(t *testing.T) {
	up := &fakeUpstream{}
	stats := resource.NewStatistics(up)
	reg := new(metrics.Registry)
	require.NoError(t, reg.AddStatistics("s", stats))
	live := workload(t, stats, up)
	defer closeAll(t, live)
	srv := httptest.NewServer(reg)
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, metrics.ContentType, resp.Header.Get("Content-Type"))
	e := parseExposition(t, string(body))
	v, ok := e.get("cudamem_live_bytes", "s")
	require.True(t, ok)
	assert.Equal(t, float64(stats.Stats().CurrentBytes), v)

	resp, err = http.Post(srv.URL, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
}

func TestRegistryErrors(t *testing.T) {
	reg := new(metrics.Registry)
	st := resource.NewStatistics(&fakeUpstream{})
	for name, err := range map[string]error{
		"empty name":      reg.AddStatistics("", st),
		"nil statistics":  reg.AddStatistics("x", nil),
		"nil pool":        reg.AddPool("x", nil),
		"typed nil pool":  reg.AddPool("x", (*resource.DevicePool)(nil)),
		"nil suballoc":    reg.AddSubAllocator("x", nil),
		"nil registry":    (*metrics.Registry)(nil).AddStatistics("x", st),
		"nil writer":      reg.WritePrometheus(nil),
		"duplicate (2nd)": errors.Join(reg.AddStatistics("x", st), nil),
	} {
		if name == "duplicate (2nd)" {
			require.NoError(t, err)
			err = reg.AddPool("x", &fakePool{})
			assert.ErrorContains(t, err, `"x" is already registered`)
		}
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
	}
	assert.True(t, reg.Remove("x"))
	assert.False(t, reg.Remove("x"))
	assert.Empty(t, reg.Names())
	assert.Empty(t, scrape(t, reg).samples, "an empty registry serves an empty page")
	assert.Equal(t, "{}", reg.String())
}

// TestScrapeConcurrent: scrapes while goroutines allocate (run with
// -race); every page parses.
func TestScrapeConcurrent(t *testing.T) {
	up := &fakeUpstream{}
	stats := resource.NewStatistics(up)
	reg := new(metrics.Registry)
	require.NoError(t, reg.AddStatistics("s", stats))
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				b, err := stats.Allocate(uint64(i+1), nil)
				if assert.NoError(t, err) {
					assert.NoError(t, b.Close())
				}
			}
		}()
	}
	for range 50 {
		scrape(t, reg)
		_ = reg.String()
	}
	wg.Wait()
	e := scrape(t, reg)
	v, _ := e.get("cudamem_allocations_total", "s")
	assert.Equal(t, 2000.0, v)
}
