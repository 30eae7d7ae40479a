//go:build !linux

package main

import (
	"fmt"
	"runtime"
)

// minorFaults is not counted here.
func minorFaults() int64 { return -1 }

// releasePages cannot release pages here: the fresh-destination copies
// are skipped.
func releasePages([]byte) bool { return false }

func hostNotes() string {
	return fmt.Sprintf("%d CPUs, GOMAXPROCS %d", runtime.NumCPU(), runtime.GOMAXPROCS(0))
}

// gettid is not known here.
func gettid() int { return 0 }

// hostMemory is a Go slice here (the fresh-page copies are skipped).
func hostMemory(n uint64) ([]byte, func() error, error) {
	return make([]byte, n), func() error { return nil }, nil
}
