package metrics_test

import (
	"bufio"
	"encoding/json"
	"expvar"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/metrics"
)

// standIn is the upstream of the examples: made-up addresses, so they
// run without a GPU. A program would use resource.CurrentDevicePool(dev)
// and register the pool itself too: reg.AddPool("gpu0", pool).
type standIn struct{ next cuda.DevicePtr }

func (h *standIn) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	h.next += 0x100000
	return h.next, s, nil
}
func (h *standIn) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (h *standIn) DeviceAccessible() bool                                { return true }
func (h *standIn) HostAccessible() bool                                  { return false }
func (h *standIn) DeviceID() int                                         { return 0 }

// Serve a Statistics adaptor's counters to Prometheus. The example runs
// the handler on an httptest server; a program would call
// http.Handle("/metrics", reg) and http.ListenAndServe.
func ExampleRegistry() {
	stats := resource.NewStatistics(&standIn{})
	reg := metrics.NewRegistry()
	if err := reg.AddStatistics("model", stats); err != nil {
		log.Fatal(err)
	}
	a, _ := stats.Allocate(3<<20, nil)
	b, _ := stats.Allocate(1<<20, nil)
	a.Close()
	defer b.Close()

	srv := httptest.NewServer(reg)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.Contains(line, "_bytes") {
			fmt.Println(line)
		}
	}
	// Output:
	// # HELP cudamem_live_bytes Bytes allocated through the resource and not yet freed.
	// # TYPE cudamem_live_bytes gauge
	// cudamem_live_bytes{resource="model",device="0"} 1048576
	// # HELP cudamem_live_bytes_peak Highest cudamem_live_bytes since the resource was made or its peak reset.
	// # TYPE cudamem_live_bytes_peak gauge
	// cudamem_live_bytes_peak{resource="model",device="0"} 4194304
	// # HELP cudamem_allocated_bytes_total Bytes of every successful allocation through the resource.
	// # TYPE cudamem_allocated_bytes_total counter
	// cudamem_allocated_bytes_total{resource="model",device="0"} 4194304
}

// Publish the same counters under /debug/vars with expvar.
func ExampleRegistry_expvar() {
	stats := resource.NewStatistics(&standIn{})
	reg := new(metrics.Registry)
	if err := reg.AddStatistics("scratch", stats); err != nil {
		log.Fatal(err)
	}
	expvar.Publish("cudamem_example", reg) // served by expvar.Handler, /debug/vars
	buf, _ := stats.Allocate(4096, nil)
	defer buf.Close()

	var sn metrics.Snapshot
	if err := json.Unmarshal([]byte(expvar.Get("cudamem_example").String()), &sn); err != nil {
		log.Fatal(err)
	}
	fmt.Println(sn.Statistics["scratch"])
	// Output:
	// current 4096 bytes in 1 allocations, peak 4096 bytes / 1 allocations, total 4096 bytes in 1 allocations, 0 failures
}

// On a GPU: a device pool's driver attributes beside the counters of the
// Statistics over it. (Needs a GPU, so it has no Output.)
func ExampleRegistry_AddPool() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	stats := resource.NewStatistics(pool)
	reg := new(metrics.Registry)
	if err := reg.AddPool("gpu0", pool); err != nil {
		log.Fatal(err)
	}
	if err := reg.AddStatistics("gpu0/model", stats); err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", reg)
	expvar.Publish("cudamem", reg)
	// http.ListenAndServe(":9400", nil)
}
