package buffer

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// A slab and the allocator's type header fill a 4 KiB size class, with
// less than a Buffer to spare: one Buffer more would take the next class
// (4864 bytes), whose waste showed as 12 bytes of garbage a Buffer.
func TestSlabFillsItsSizeClass(t *testing.T) {
	header := unsafe.Sizeof(uintptr(0))
	size := unsafe.Sizeof(slab{}) + header
	assert.LessOrEqual(t, size, uintptr(4096))
	assert.Greater(t, size+unsafe.Sizeof(Buffer{}), uintptr(4096))
	if header == 8 {
		assert.Equal(t, uintptr(56), unsafe.Sizeof(Buffer{}), "an owned Buffer is 56 bytes on 64-bit targets")
	}
}
