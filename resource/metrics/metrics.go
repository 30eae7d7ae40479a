package metrics

import (
	"bufio"
	"encoding/json"
	"expvar"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// PoolSource is a memory pool whose attributes can be read:
// resource.DevicePool, resource.PinnedPool, an imported IPC pool.
type PoolSource interface {
	Attributes() (resource.PoolAttributes, error)
}

// deviced is the optional method that labels a source with its device.
type deviced interface{ DeviceID() int }

type sourceKind int

const (
	kindStatistics sourceKind = iota
	kindPool
	kindSubAllocator
	kindSleep
)

type source struct {
	name  string
	kind  sourceKind
	stats *resource.Statistics
	pool  PoolSource
	sub   *resource.SubAllocator
	vmm   *virtual.Resource
}

func (s source) device() int {
	var d deviced
	switch s.kind {
	case kindStatistics:
		d = s.stats
	case kindSubAllocator:
		d = s.sub
	case kindSleep:
		d = s.vmm
	default:
		d, _ = s.pool.(deviced)
	}
	if d == nil {
		return -1
	}
	return d.DeviceID()
}

// Registry is a set of named memory sources served as metrics, an
// expvar.Var (the JSON of [Registry.Snapshot]) and an http.Handler (the
// Prometheus text format). The zero value is ready to use. It is safe for
// concurrent use: sources are read at each scrape without the registry's
// lock, so a slow driver call does not block Add.
type Registry struct {
	mu      sync.Mutex
	sources []source
}

var (
	_ expvar.Var   = (*Registry)(nil)
	_ http.Handler = (*Registry)(nil)
)

// NewRegistry returns an empty registry (the same as new(Registry)).
func NewRegistry() *Registry { return new(Registry) }

func (r *Registry) add(op string, s source, missing bool) error {
	if r == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil Registry")
	}
	if s.name == "" {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "empty name")
	}
	if missing {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil source for %q", s.name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.sources {
		if o.name == s.name {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "a source named %q is already registered", s.name)
		}
	}
	r.sources = append(r.sources, s)
	return nil
}

// AddStatistics registers a Statistics adaptor under name, which must be
// non-empty and unused in the registry; errors match
// cuda.ErrInvalidArgument.
func (r *Registry) AddStatistics(name string, s *resource.Statistics) error {
	return r.add("Registry.AddStatistics", source{name: name, kind: kindStatistics, stats: s}, s == nil)
}

// AddPool registers a pool under name, which must be non-empty and unused
// in the registry; errors match cuda.ErrInvalidArgument. Its attributes are
// read from the driver at each scrape.
func (r *Registry) AddPool(name string, p PoolSource) error {
	missing := p == nil
	if !missing {
		v := reflect.ValueOf(p)
		missing = v.Kind() == reflect.Pointer && v.IsNil()
	}
	return r.add("Registry.AddPool", source{name: name, kind: kindPool, pool: p}, missing)
}

// AddSubAllocator registers a sub-allocator under name, which must be
// non-empty and unused in the registry; errors match
// cuda.ErrInvalidArgument.
func (r *Registry) AddSubAllocator(name string, a *resource.SubAllocator) error {
	return r.add("Registry.AddSubAllocator", source{name: name, kind: kindSubAllocator, sub: a}, a == nil)
}

// AddSleep registers the sleeping memory of a virtual.Resource (its
// SleepStats, one sample per tag) under name, which must be non-empty and
// unused in the registry; errors match cuda.ErrInvalidArgument. For a
// virtual pool, register its Upstream.
func (r *Registry) AddSleep(name string, v *virtual.Resource) error {
	return r.add("Registry.AddSleep", source{name: name, kind: kindSleep, vmm: v}, v == nil)
}

// Remove takes the source called name out of the registry and reports
// whether there was one.
func (r *Registry) Remove(name string) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.IndexFunc(r.sources, func(s source) bool { return s.name == name })
	if i < 0 {
		return false
	}
	r.sources = slices.Delete(r.sources, i, i+1)
	return true
}

// Names lists the registered sources, sorted.
func (r *Registry) Names() []string {
	var out []string
	for _, s := range r.list() {
		out = append(out, s.name)
	}
	return out
}

// list copies the sources sorted by name, so output is deterministic.
func (r *Registry) list() []source {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	out := slices.Clone(r.sources)
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b source) int { return strings.Compare(a.name, b.name) })
	return out
}

// Snapshot is every source's values at one scrape, keyed by name. Its
// JSON is what the expvar form serves.
type Snapshot struct {
	Statistics    map[string]resource.Stats             `json:"statistics,omitempty"`
	Pools         map[string]resource.PoolAttributes    `json:"pools,omitempty"`
	SubAllocators map[string]resource.SubAllocatorStats `json:"suballocators,omitempty"`
	// Sleep holds each virtual.Resource's SleepStats, one per tag.
	Sleep map[string][]virtual.SleepStats `json:"sleep,omitempty"`
	// Devices is each source's device (-1 for host memory).
	Devices map[string]int `json:"devices,omitempty"`
	// Errors holds, for each source that could not be read, why.
	Errors map[string]string `json:"errors,omitempty"`
}

// reading is one source's values at a scrape.
type reading struct {
	source
	dev   int
	stats resource.Stats
	attrs resource.PoolAttributes
	sub   resource.SubAllocatorStats
	sleep []virtual.SleepStats
	err   error
}

func (r *Registry) read() []reading {
	srcs := r.list()
	out := make([]reading, len(srcs))
	for i, s := range srcs {
		rd := reading{source: s, dev: s.device()}
		switch s.kind {
		case kindStatistics:
			rd.stats = s.stats.Stats()
		case kindPool:
			rd.attrs, rd.err = s.pool.Attributes()
		case kindSubAllocator:
			rd.sub = s.sub.Stats()
		case kindSleep:
			rd.sleep = s.vmm.SleepStats()
		}
		out[i] = rd
	}
	return out
}

// Snapshot reads every source now (empty for a nil Registry).
func (r *Registry) Snapshot() Snapshot {
	var sn Snapshot
	for _, rd := range r.read() {
		put(&sn.Devices, rd.name, rd.dev)
		if rd.err != nil {
			put(&sn.Errors, rd.name, rd.err.Error())
			continue
		}
		switch rd.kind {
		case kindStatistics:
			put(&sn.Statistics, rd.name, rd.stats)
		case kindPool:
			put(&sn.Pools, rd.name, rd.attrs)
		case kindSubAllocator:
			put(&sn.SubAllocators, rd.name, rd.sub)
		case kindSleep:
			put(&sn.Sleep, rd.name, rd.sleep)
		}
	}
	return sn
}

// put sets (*m)[k], making the map first: a Snapshot's maps stay nil
// (left out of its JSON) until they hold something.
func put[V any](m *map[string]V, k string, v V) {
	if *m == nil {
		*m = map[string]V{}
	}
	(*m)[k] = v
}

// String returns the JSON of Snapshot: the expvar.Var form, so that
// expvar.Publish("cudamem", reg) serves it under /debug/vars.
func (r *Registry) String() string {
	b, err := json.Marshal(r.Snapshot())
	if err != nil { // maps of plain numbers and strings: cannot happen
		return "{}"
	}
	return string(b)
}

// ContentType is the media type of the Prometheus text format served.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// ServeHTTP writes the metrics in the Prometheus text format.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if w == nil {
		return
	}
	w.Header().Set("Content-Type", ContentType)
	if req != nil && req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	_ = r.WritePrometheus(w) // a failed write is the client gone
}

// family is one metric: name, help, type and how to get its value.
type family struct {
	name, help, typ string
	kind            sourceKind
	value           func(rd *reading) uint64
}

var families = []family{
	{"cudamem_live_bytes", "Bytes allocated through the resource and not yet freed.", "gauge", kindStatistics, func(rd *reading) uint64 { return rd.stats.CurrentBytes }},
	{"cudamem_live_bytes_peak", "Highest cudamem_live_bytes since the resource was made or its peak reset.", "gauge", kindStatistics, func(rd *reading) uint64 { return rd.stats.PeakBytes }},
	{"cudamem_live_allocations", "Allocations live through the resource.", "gauge", kindStatistics, func(rd *reading) uint64 { return rd.stats.CurrentCount }},
	{"cudamem_live_allocations_peak", "Highest cudamem_live_allocations since the resource was made or its peak reset.", "gauge", kindStatistics, func(rd *reading) uint64 { return rd.stats.PeakCount }},
	{"cudamem_allocated_bytes_total", "Bytes of every successful allocation through the resource.", "counter", kindStatistics, func(rd *reading) uint64 { return rd.stats.TotalBytes }},
	{"cudamem_allocations_total", "Successful allocations through the resource.", "counter", kindStatistics, func(rd *reading) uint64 { return rd.stats.TotalCount }},
	{"cudamem_allocation_failures_total", "Allocations the upstream refused.", "counter", kindStatistics, func(rd *reading) uint64 { return rd.stats.Failures }},
	{"cudamem_pool_reserved_bytes", "Memory the pool holds from the system (driver attribute RESERVED_MEM_CURRENT).", "gauge", kindPool, func(rd *reading) uint64 { return rd.attrs.ReservedMemCurrent }},
	{"cudamem_pool_reserved_bytes_high", "High watermark of cudamem_pool_reserved_bytes (RESERVED_MEM_HIGH).", "gauge", kindPool, func(rd *reading) uint64 { return rd.attrs.ReservedMemHigh }},
	{"cudamem_pool_used_bytes", "Pool memory handed out to allocations not yet freed (USED_MEM_CURRENT).", "gauge", kindPool, func(rd *reading) uint64 { return rd.attrs.UsedMemCurrent }},
	{"cudamem_pool_used_bytes_high", "High watermark of cudamem_pool_used_bytes (USED_MEM_HIGH).", "gauge", kindPool, func(rd *reading) uint64 { return rd.attrs.UsedMemHigh }},
	{"cudamem_pool_release_threshold_bytes", "Reserved bytes the pool keeps at synchronization points (RELEASE_THRESHOLD).", "gauge", kindPool, func(rd *reading) uint64 { return rd.attrs.ReleaseThreshold }},
	{"cudamem_suballocator_reserved_bytes", "Bytes the sub-allocator holds from its upstream.", "gauge", kindSubAllocator, func(rd *reading) uint64 { return rd.sub.Reserved }},
	{"cudamem_suballocator_used_bytes", "Bytes of live sub-allocations, each rounded up to the alignment.", "gauge", kindSubAllocator, func(rd *reading) uint64 { return rd.sub.Used }},
	{"cudamem_suballocator_free_bytes", "Bytes in the sub-allocator's free ranges.", "gauge", kindSubAllocator, func(rd *reading) uint64 { return rd.sub.Free }},
	{"cudamem_suballocator_blocks", "Upstream blocks the sub-allocator holds.", "gauge", kindSubAllocator, func(rd *reading) uint64 { return uint64(rd.sub.Blocks) }},
	{"cudamem_suballocator_allocations", "Live sub-allocations.", "gauge", kindSubAllocator, func(rd *reading) uint64 { return uint64(rd.sub.Allocations) }},
	{"cudamem_suballocator_free_ranges", "Free ranges in the sub-allocator's blocks; more ranges than blocks means fragmentation.", "gauge", kindSubAllocator, func(rd *reading) uint64 { return uint64(rd.sub.FreeRanges) }},
}

// sleepFamilies are the metrics of sleeping memory, one sample per tag.
var sleepFamilies = []struct {
	name, help, typ string
	value           func(st *virtual.SleepStats) uint64
}{
	{"cudamem_sleep_asleep_bytes", "Bytes of physical memory the tag's sleeping allocations released.", "gauge", func(st *virtual.SleepStats) uint64 { return st.Asleep }},
	{"cudamem_sleep_asleep_allocations", "Allocations of the tag asleep.", "gauge", func(st *virtual.SleepStats) uint64 { return uint64(st.Allocations) }},
	{"cudamem_sleep_backup_bytes", "Bytes of the tag's contents kept in a backup while asleep.", "gauge", func(st *virtual.SleepStats) uint64 { return st.Backup }},
	{"cudamem_sleeps_total", "Sleep calls that put allocations of the tag to sleep.", "counter", func(st *virtual.SleepStats) uint64 { return st.Sleeps }},
	{"cudamem_wakes_total", "Wake calls that woke allocations of the tag.", "counter", func(st *virtual.SleepStats) uint64 { return st.Wakes }},
	{"cudamem_sleep_last_microseconds", "Microseconds the tag's last Sleep took.", "gauge", func(st *virtual.SleepStats) uint64 { return uint64(st.LastSleep.Microseconds()) }},
	{"cudamem_wake_last_microseconds", "Microseconds the tag's last Wake took.", "gauge", func(st *virtual.SleepStats) uint64 { return uint64(st.LastWake.Microseconds()) }},
}

// WritePrometheus writes every source's metrics to w in the Prometheus
// text exposition format (version 0.0.4): for each metric with samples,
// a # HELP and a # TYPE line, then one sample per source, sorted by name.
// A nil w is an error matching cuda.ErrInvalidArgument.
func (r *Registry) WritePrometheus(w io.Writer) error {
	if w == nil {
		return cuda.Errorf("Registry.WritePrometheus", cuda.ErrInvalidArgument, "nil writer")
	}
	rds := r.read()
	bw := bufio.NewWriter(w)
	var line []byte
	for _, f := range families {
		head := false
		for i := range rds {
			rd := &rds[i]
			if rd.kind != f.kind || rd.err != nil {
				continue
			}
			if !head {
				writeHead(bw, f.name, f.help, f.typ)
				head = true
			}
			line = appendSample(line[:0], f.name, rd, nil, f.value(rd))
			bw.Write(line)
		}
	}
	for _, f := range sleepFamilies {
		head := false
		for i := range rds {
			rd := &rds[i]
			if rd.kind != kindSleep {
				continue
			}
			for j := range rd.sleep {
				if !head {
					writeHead(bw, f.name, f.help, f.typ)
					head = true
				}
				line = appendSample(line[:0], f.name, rd, &rd.sleep[j].Tag, f.value(&rd.sleep[j]))
				bw.Write(line)
			}
		}
	}
	if len(rds) > 0 {
		writeHead(bw, "cudamem_source_up", "1 if the source could be read at this scrape, else 0.", "gauge")
		for i := range rds {
			up := uint64(1)
			if rds[i].err != nil {
				up = 0
			}
			line = appendSample(line[:0], "cudamem_source_up", &rds[i], nil, up)
			bw.Write(line)
		}
	}
	return bw.Flush()
}

// writeHead writes a metric's HELP and TYPE lines. The help texts are
// this file's constants, free of the backslashes and line feeds the
// format would have escaped.
func writeHead(w *bufio.Writer, name, help, typ string) {
	w.WriteString("# HELP " + name + " " + help + "\n")
	w.WriteString("# TYPE " + name + " " + typ + "\n")
}

// appendSample appends one sample of rd's: its resource and device
// labels, and a tag label when tag is not nil (sleeping memory's).
func appendSample(b []byte, name string, rd *reading, tag *string, v uint64) []byte {
	b = append(b, name...)
	b = append(b, `{resource="`...)
	b = appendLabelValue(b, rd.name)
	b = append(b, `",device="`...)
	b = strconv.AppendInt(b, int64(rd.dev), 10)
	if tag != nil {
		b = append(b, `",tag="`...)
		b = appendLabelValue(b, *tag)
	}
	b = append(b, `"} `...)
	b = strconv.AppendUint(b, v, 10)
	return append(b, '\n')
}

// appendLabelValue escapes a label value: backslash, double quote and
// line feed, as the text format requires.
func appendLabelValue(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}
