// Package batchhook holds the test switch that sends cudamem's batched
// copies (cuda.Stream.MemcpyBatchAsync, and buffer.CopyBatch above it)
// down their loop of cuMemcpyAsync even where the driver has
// cuMemcpyBatchAsync, so that tests on a current driver cover the path
// older drivers take. Only tests set it; it imports nothing, so package
// cuda can read it.
package batchhook
