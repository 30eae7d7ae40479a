//go:build !linux

package main

import (
	"errors"
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

// populatePages cannot ask the kernel to map pages here: the mapping
// ceilings are skipped.
func populatePages([]byte) error {
	return skipf("mapping pages ahead (madvise MADV_POPULATE_WRITE) is Linux's")
}

// dupFD is not needed here: the IPC measurements are Linux's.
func dupFD(int) (int, error) { return -1, errors.ErrUnsupported }

// adviseHuge has no huge pages to ask for here.
func adviseHuge([]byte) {}
