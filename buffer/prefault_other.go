//go:build !linux

package buffer

import "unsafe"

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// populate is Linux's; elsewhere prefaulting touches pages.
func populate([]byte) bool {
	populateRefused.Store(true)
	return false
}

func adviseHugePages([]byte) {}

// mapped cannot tell here: prefaulting touches every page.
func mapped([]byte) bool { return false }

// fresh cannot tell here: copies out use the workers of mapped memory.
func fresh([]byte) bool { return false }

func populateWhole([]byte) bool {
	populateRefused.Store(true)
	return false
}
