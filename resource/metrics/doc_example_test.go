package metrics_test

import (
	"expvar"
	"log"
	"net/http"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/metrics"
)

// Serve a program's GPU memory to Prometheus (/metrics) and expvar
// (/debug/vars): the counters of a Statistics adaptor and the pool's own
// attributes, read afresh at every scrape.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	stats := resource.NewStatistics(pool) // allocate through stats

	reg := metrics.NewRegistry()
	if err := reg.AddStatistics("model", stats); err != nil {
		log.Fatal(err)
	}
	if err := reg.AddPool("gpu0", pool); err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", reg)
	expvar.Publish("cudamem", reg)
	log.Fatal(http.ListenAndServe("localhost:9090", nil))
}
