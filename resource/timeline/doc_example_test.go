package timeline_test

import (
	"log"
	"os"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/timeline"
)

// Record what a workload does with the device's pool, then keep the trace
// for chrome://tracing or Perfetto, and as JSON: `cudamem timeline -in
// trace.json` draws it later, on any machine.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.CurrentDevicePool(dev)
	if err != nil {
		log.Fatal(err)
	}
	events := timeline.NewLog(0)
	mr := timeline.NewRecorder(pool, events, &timeline.RecorderOptions{Name: "pool"})

	weights, err := mr.Allocate(256<<20, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer weights.Close()
	for range 8 {
		scratch, err := mr.Allocate(64<<20, nil)
		if err != nil {
			log.Fatal(err)
		}
		if err := scratch.Close(); err != nil {
			log.Fatal(err)
		}
	}

	tr := events.Trace()
	chrome, err := os.Create("trace.chrome.json")
	if err != nil {
		log.Fatal(err)
	}
	defer chrome.Close()
	if err := tr.WriteChromeTrace(chrome); err != nil {
		log.Fatal(err)
	}
	js, err := os.Create("trace.json")
	if err != nil {
		log.Fatal(err)
	}
	defer js.Close()
	if err := tr.WriteJSON(js); err != nil {
		log.Fatal(err)
	}
}
