package buffer

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// A slab and the allocator's type header fill their size class, with less
// than a Buffer to spare: one Buffer more would take the next class, whose
// waste showed as garbage a Buffer.
func TestSlabFillsItsSizeClass(t *testing.T) {
	const header = 8 // the runtime's malloc header, on every target
	size := unsafe.Sizeof(slab{}) + header
	assert.LessOrEqual(t, size, uintptr(slabBytes))
	assert.Greater(t, size+unsafe.Sizeof(Buffer{}), uintptr(slabBytes))
	if unsafe.Sizeof(uintptr(0)) == 8 {
		assert.Equal(t, uintptr(40), unsafe.Sizeof(Buffer{}), "an owned Buffer is 40 bytes on 64-bit targets")
	}
}

// The cursors' table grows with GOMAXPROCS (a goroutine that finds its P
// beyond the table grows it; here the test grows it as that goroutine
// would), and what it held stays usable.
func TestCursorsGrowWithGOMAXPROCS(t *testing.T) {
	if !cursorsPerP {
		t.Skip("under the race detector the cursors are a fixed set of shards")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 6))
	growCursors()
	assert.GreaterOrEqual(t, cursorCount(), runtime.GOMAXPROCS(0), "a cursor for every P")
	c := pin()
	ok := c != nil
	unpin(c)
	assert.True(t, ok, "the running P has a cursor")
	assert.NotNil(t, carve(nil, nil, nil))
}
