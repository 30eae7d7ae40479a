package gpuprof_test

import (
	"io"
	"testing"

	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/gpuprof"
)

// countingWriter counts the bytes written to it.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

//go:noinline
func allocAt(mr *resource.Tracking, site int) {
	// Distinct call sites: one line per case, so each stack differs.
	var err error
	switch site % 4 {
	case 0:
		_, _, err = mr.AllocatePtr(1<<20, nil)
	case 1:
		_, _, err = mr.AllocatePtr(1<<20, nil)
	case 2:
		_, _, err = mr.AllocatePtr(1<<20, nil)
	default:
		_, _, err = mr.AllocatePtr(1<<20, nil)
	}
	if err != nil {
		panic(err)
	}
}

// BenchmarkWriteHeapProfile100k writes the profile of 100,000 live
// allocations made at 4 call sites (stacks captured), over a fake upstream
// on the CPU, and reports the profile's size in bytes.
func BenchmarkWriteHeapProfile100k(b *testing.B) {
	mr := resource.NewTracking(newFake(), &resource.TrackingOptions{CaptureStacks: true})
	for i := range 100_000 {
		allocAt(mr, i)
	}
	var size int64
	b.ReportAllocs()
	for b.Loop() {
		w := &countingWriter{}
		if err := gpuprof.WriteHeapProfile(w, mr); err != nil {
			b.Fatal(err)
		}
		size = w.n
	}
	b.ReportMetric(float64(size), "profile-bytes")
}

var _ io.Writer = (*countingWriter)(nil)
