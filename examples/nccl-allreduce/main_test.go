package main

import (
	"errors"
	"testing"

	"github.com/cudamem/cudamem/internal/cudatest"
	"github.com/cudamem/cudamem/loader"
)

// GPU: the example all-reduces on every local GPU and checks every
// element (run checks them before and after the timed loop). Without NCCL
// it skips, saying so: NCCL is not part of the driver.
func TestGPUNCCLAllReduce(t *testing.T) {
	cudatest.Device(t)
	if _, err := openNCCL(); err != nil {
		var le *loader.LibraryError
		if errors.As(err, &le) {
			t.Skipf("NCCL not found: %v", err)
		}
		t.Fatal(err)
	}
	res, err := run(64<<20, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NCCL %d (%s), %d rank(s), 64 MiB: %v per allreduce, algbw %.1f GB/s, busbw %.1f GB/s",
		res.NCCLVersion, res.Library, res.Ranks, res.Time, res.AlgBW, res.BusBW)
	if res.Ranks < 1 || res.Time <= 0 || res.AlgBW <= 0 {
		t.Fatalf("implausible measurement: %+v", res)
	}
}

// Bad sizes are refused before anything is opened.
func TestRunRefusesBadSizes(t *testing.T) {
	for _, c := range []struct {
		size  uint64
		iters int
	}{{0, 1}, {6, 1}, {64, 0}} {
		if _, err := run(c.size, c.iters, 0); err == nil {
			t.Errorf("run(%d, %d): no error", c.size, c.iters)
		}
	}
}
