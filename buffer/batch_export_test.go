package buffer

import (
	"slices"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/batchhook"
)

// ForceBatchLoop sends every batch down the loop of cuMemcpyAsync (on or
// off); the returned function restores the previous setting.
func ForceBatchLoop(on bool) (restore func()) {
	old := batchhook.ForceLoop.Swap(on)
	return func() { batchhook.ForceLoop.Store(old) }
}

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
