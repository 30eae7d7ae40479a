//go:build race

package buffer

// cursorCount and cursorsPerP: a fixed number of shards, whatever
// GOMAXPROCS is.
func cursorCount() int { return len(raceShards) }

const cursorsPerP = false
