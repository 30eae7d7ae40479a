package buffer

import (
	"slices"
	"time"
	_ "unsafe" // for go:linkname

	"github.com/cudamem/cudamem/cuda"
)

// ForceBatchLoop sends every batch down the loop of cuMemcpyAsync (on or
// off); the returned function restores the previous setting. It is package
// cuda's test switch (cuda/batch.go), reached by name.
//
//go:linkname ForceBatchLoop github.com/cudamem/cudamem/cuda.forceBatchLoop
func ForceBatchLoop(on bool) (restore func())

// SetBatchChunk makes n the most copies one driver call of a batch carries
// (0: the default); the returned function restores the previous setting.
// It is package cuda's test switch (cuda/batch.go), reached by name.
//
//go:linkname SetBatchChunk github.com/cudamem/cudamem/cuda.setBatchChunk
func SetBatchChunk(n int) (restore func())

// BatchArrays returns copies of the arrays CopyBatch passes to the driver
// for copies, without submitting them (not safe for concurrent use).
func BatchArrays(s *cuda.Stream, copies []Copy) (dsts, srcs []cuda.DevicePtr, sizes []uint64, attrs []cuda.MemcpyAttributes, idxs []uint64, err error) {
	old := submitBatch
	defer func() { submitBatch = old }()
	submitBatch = func(_ *cuda.Stream, d, s []cuda.DevicePtr, z []uint64, a []cuda.MemcpyAttributes, i []uint64) error {
		dsts, srcs, sizes, attrs, idxs = slices.Clone(d), slices.Clone(s), slices.Clone(z), slices.Clone(a), slices.Clone(i)
		return nil
	}
	err = CopyBatch(s, copies)
	return
}

// CopyBatchHostTime is how long CopyBatch's own work on copies takes (its
// checks, holds and arrays), with the driver call left out: the median of
// reps runs.
func CopyBatchHostTime(s *cuda.Stream, copies []Copy, reps int) (time.Duration, error) {
	old := submitBatch
	defer func() { submitBatch = old }()
	submitBatch = func(*cuda.Stream, []cuda.DevicePtr, []cuda.DevicePtr, []uint64, []cuda.MemcpyAttributes, []uint64) error {
		return nil
	}
	ts := make([]time.Duration, reps)
	for i := range ts {
		t0 := time.Now()
		if err := CopyBatch(s, copies); err != nil {
			return 0, err
		}
		ts[i] = time.Since(t0)
	}
	slices.Sort(ts)
	return ts[reps/2], nil
}
