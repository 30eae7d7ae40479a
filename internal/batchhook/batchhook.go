package batchhook

import "sync/atomic"

// ForceLoop, while true, makes every batch use the loop.
var ForceLoop atomic.Bool
