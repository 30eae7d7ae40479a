// Package batchhook holds the test switches of cudamem's batched copies
// (cuda.Stream.MemcpyBatchAsync, and buffer.CopyBatch above it): ForceLoop
// sends them down their loop of cuMemcpyAsync even where the driver has
// cuMemcpyBatchAsync, so that tests on a current driver cover the path
// older drivers take; Chunk sets how many copies one batched driver call
// carries, so that benchmarks can compare. Only tests set them; the
// package imports nothing, so package cuda can read it.
package batchhook
