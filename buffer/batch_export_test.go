package buffer

import "github.com/cudamem/cudamem/internal/batchhook"

// ForceBatchLoop sends every batch down the loop of cuMemcpyAsync (on or
// off); the returned function restores the previous setting.
func ForceBatchLoop(on bool) (restore func()) {
	old := batchhook.ForceLoop.Swap(on)
	return func() { batchhook.ForceLoop.Store(old) }
}
