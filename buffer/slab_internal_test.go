package buffer

import (
	"testing"
	"unsafe"
)

// TestSlabSizes: a slab and its side fill size classes of the Go
// allocator (4 KiB, and 2 KiB or 2.25 KiB; objects over 512 bytes
// that hold pointers carry an 8-byte header), so that a Buffer costs at
// most 64 bytes of heap.
func TestSlabSizes(t *testing.T) {
	class := func(n uintptr) uintptr {
		for _, c := range []uintptr{2048, 2304, 2688, 3072, 3200, 3456, 4096} {
			if n <= c {
				return c
			}
		}
		t.Fatalf("%d bytes", n)
		return 0
	}
	slabBytes, sideBytes := class(unsafe.Sizeof(slab{})+8), class(unsafe.Sizeof(slabSide{})+8)
	if slabBytes != 4096 || sideBytes > 2304 {
		t.Errorf("a slab takes %d bytes, its side %d", slabBytes, sideBytes)
	}
	if per := float64(slabBytes+sideBytes) / float64(slabSize); per > 64 {
		t.Errorf("%.1f bytes per Buffer", per)
	}
}
