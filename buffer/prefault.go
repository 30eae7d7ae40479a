package buffer

import (
	"os"
	"sync/atomic"

	"github.com/cudamem/cudamem/internal/staging"
)

// A copy out of a device into a fresh Go slice writes pages the kernel
// has not mapped yet: each first write faults, and the kernel zeroes the
// page before the copy overwrites it. Left to the copy, those faults come
// after the piece's DMA has landed, on the copy's critical path. With
// prefaulting on, each worker maps its stripe of a piece while that
// piece's DMA still runs (pipeline.before).

var pageSize = os.Getpagesize()

// populateRefused is set once the kernel has refused MADV_POPULATE_WRITE
// (before Linux 5.14, or not Linux): later copies touch pages instead.
var populateRefused atomic.Bool

// prefault maps the pages of b as mode says. A range already mapped (a
// slice reused from copy to copy, the common case) is left alone at the
// cost of one mincore call: touching or populating it again would cost a
// fifth of the copy.
func prefault(b []byte, mode staging.Prefault) {
	if len(b) == 0 || mode == staging.PrefaultOff {
		return
	}
	if whole := pageRange(b, pageSize); whole != nil && mapped(whole) {
		return
	}
	if mode == staging.PrefaultPopulate && !populateRefused.Load() {
		if populate(b) {
			return
		}
	}
	touch(b)
}

// touch writes a zero into every page of b (which the copy overwrites).
func touch(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		b[i] = 0
	}
	b[len(b)-1] = 0
}

// pageRange is the largest page-aligned part of b, or nil.
func pageRange(b []byte, align int) []byte {
	if len(b) == 0 {
		return nil
	}
	start := int(addrOf(b))
	lo := (start+align-1)&^(align-1) - start
	hi := (start+len(b))&^(align-1) - start
	if lo >= hi {
		return nil
	}
	return b[lo:hi]
}

// populateAhead maps b's whole pages for writing, from a goroutine other
// than the one that writes them: only through the kernel (populate), which
// leaves the bytes as they are; where it refuses, nothing is done and the
// copy faults the pages in itself.
func populateAhead(b []byte) {
	whole := pageRange(b, pageSize)
	if whole == nil || populateRefused.Load() || mapped(whole) {
		return
	}
	populateWhole(whole)
}
