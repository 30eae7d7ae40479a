package batchhook

import "sync/atomic"

// ForceLoop, while true, makes every batch use the loop.
var ForceLoop atomic.Bool

// Chunk, while above 0, replaces the most copies one driver call of a
// batch carries (benchmarks compare chunk sizes, one call included).
var Chunk atomic.Int64
