//go:build !race

package buffer

// cursorCount is how many cursors there are, and cursorsPerP whether they
// follow GOMAXPROCS.
func cursorCount() int {
	if p := perP.Load(); p != nil {
		return len(*p)
	}
	return 0
}

const cursorsPerP = true
