package gpuprof

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"

	"github.com/cudamem/cudamem/resource"
)

// Handler serves the profile of t's allocations, as net/http/pprof
// serves the Go heap's: mount it beside those handlers,
//
//	http.Handle("/debug/pprof/gpuheap", gpuprof.Handler(t))
//
// and read it with `go tool pprof -http=: http://host/debug/pprof/gpuheap`.
// With ?debug=1 it serves Tracking.Report as text instead, for a browser
// or curl. The profile is built per request, so it costs nothing between
// requests; building it takes t's lock for as long as copying its records
// does.
func Handler(t *resource.Tracking) http.Handler {
	return handler{t}
}

type handler struct{ t *resource.Tracking }

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if h.t == nil {
		http.Error(w, "gpuprof: no Tracking to profile", http.StatusInternalServerError)
		return
	}
	if d := r.FormValue("debug"); d != "" && d != "0" {
		if _, err := strconv.Atoi(d); err != nil {
			http.Error(w, fmt.Sprintf("gpuprof: bad debug=%q (want a number)", d), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(h.t.Report())) // a failed write is the client's going away
		return
	}
	// Built in memory first, so that a failure is still an HTTP error
	// rather than half a profile with a 200 status.
	var buf bytes.Buffer
	if err := WriteHeapProfile(&buf, h.t); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="gpuheap.pb.gz"`)
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	_, _ = w.Write(buf.Bytes())
}
