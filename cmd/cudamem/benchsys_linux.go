package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// minorFaults is the process's minor page faults so far (getrusage).
func minorFaults() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return int64(ru.Minflt)
}

// releasePages gives b's whole pages back to the kernel (madvise
// MADV_DONTNEED): the next write to each faults in a fresh zeroed page,
// as in a slice just made. It reports whether it could.
func releasePages(b []byte) bool {
	ps := os.Getpagesize()
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := int((start+uintptr(ps)-1)&^uintptr(ps-1) - start)
	hi := int((start+uintptr(len(b)))&^uintptr(ps-1) - start)
	if lo >= hi {
		return true // no whole page: nothing to release
	}
	return unix.Madvise(b[lo:hi], unix.MADV_DONTNEED) == nil
}

// hostNotes describes what the host-copy figures depend on: the kernel,
// its transparent huge pages, the cores.
func hostNotes() string {
	var u unix.Utsname
	kernel := "?"
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	thp := func(f string) string {
		b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/" + f)
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("kernel %s, transparent huge pages %q (defrag %q), %d CPUs, GOMAXPROCS %d",
		kernel, thp("enabled"), thp("defrag"), runtime.NumCPU(), runtime.GOMAXPROCS(0))
}

// gettid is the calling OS thread's id.
func gettid() int { return unix.Gettid() }

// hostMemory returns n bytes of anonymous memory mapped for the
// host-copy measurements, outside the Go heap: gigabytes of live heap
// would space the collections out and so change what the allocation
// measurements of the same run measure. free unmaps it.
func hostMemory(n uint64) (b []byte, free func() error, err error) {
	b, err = unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping %d bytes of host memory: %w", n, err)
	}
	return b, func() error { return unix.Munmap(b) }, nil
}

// populatePages has the kernel map b's pages for writing without
// changing their bytes (madvise MADV_POPULATE_WRITE, Linux 5.14 and
// later). A kernel that refuses skips the measurement: writing a byte
// per page instead would time something else under the same name.
func populatePages(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err != nil {
		return skipf("madvise MADV_POPULATE_WRITE of %d bytes: %v", len(b), err)
	}
	return nil
}

// dupFD duplicates fd (close-on-exec).
func dupFD(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// adviseHuge asks for huge pages behind b (madvise MADV_HUGEPAGE; b is
// a mapping of its own, page-aligned).
func adviseHuge(b []byte) { _ = unix.Madvise(b, unix.MADV_HUGEPAGE) }
