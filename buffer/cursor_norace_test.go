//go:build !race

package buffer

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A P beyond the cursors' table (GOMAXPROCS grew since it was made) makes
// its Buffer through the slow path, which grows the table.
func TestCursorsGrowOnAMissingCursor(t *testing.T) {
	old := perP.Load()
	defer perP.Store(old)
	empty := []cursor{}
	perP.Store(&empty)
	require.Nil(t, func() *cursor { c := pin(); unpin(c); return c }(), "no cursor for any P")
	b := carve(nil, nil, nil)
	require.NotNil(t, b)
	assert.GreaterOrEqual(t, cursorCount(), runtime.GOMAXPROCS(0), "the slow path grew the table")
}
