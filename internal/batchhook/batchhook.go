// Package batchhook holds the test switch that sends cudamem's batched
// copies (cuda.Stream.MemcpyBatchAsync, and buffer.CopyBatch above it)
// down their loop of cuMemcpyAsync even where the driver has
// cuMemcpyBatchAsync, so that tests on a current driver cover the path
// older drivers take. Only tests set it.
package batchhook

import "sync/atomic"

// ForceLoop, while true, makes every batch use the loop.
var ForceLoop atomic.Bool
