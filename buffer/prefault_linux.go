package buffer

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// populate asks the kernel to map b's whole pages for writing, and
// reports whether it did; the partial pages at the ends are touched.
func populate(b []byte) bool {
	whole := pageRange(b, pageSize)
	if whole == nil {
		touch(b)
		return true
	}
	if !populateWhole(whole) {
		return false
	}
	head := addrOf(whole) - addrOf(b)
	if head > 0 {
		b[0] = 0
	}
	if tail := int(head) + len(whole); tail < len(b) {
		b[len(b)-1] = 0
	}
	return true
}

// populateWhole maps whole (page-aligned) for writing, and reports
// whether the kernel did.
func populateWhole(whole []byte) bool {
	if err := unix.Madvise(whole, unix.MADV_POPULATE_WRITE); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			populateRefused.Store(true)
		}
		return false
	}
	return true
}

// adviseHugePages asks the kernel for huge pages behind b's whole 2 MiB
// blocks; a kernel without them, or one that refuses, is left as it is.
func adviseHugePages(b []byte) {
	if r := pageRange(b, 2<<20); r != nil {
		_ = unix.Madvise(r, unix.MADV_HUGEPAGE)
	}
}

// mapped reports whether every page of whole (page-aligned) is mapped,
// as far as mincore can tell; false when it cannot.
func mapped(whole []byte) bool {
	var vec [512]byte
	step := len(vec) * pageSize
	for off := 0; off < len(whole); off += step {
		part := whole[off:min(len(whole), off+step)]
		n := (len(part) + pageSize - 1) / pageSize
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, addrOf(part), uintptr(len(part)), uintptr(unsafe.Pointer(&vec[0])))
		if errno != 0 {
			return false
		}
		for _, v := range vec[:n] {
			if v&1 == 0 {
				return false
			}
		}
	}
	return true
}

// fresh reports whether b looks fresh: its first or its last whole page
// is not mapped yet (one mincore call each; a slice touched in part
// counts as fresh). False where mincore cannot tell.
func fresh(b []byte) bool {
	whole := pageRange(b, pageSize)
	if len(whole) == 0 {
		return false
	}
	for _, off := range [2]int{0, len(whole) - pageSize} {
		var v byte
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, addrOf(whole[off:]), uintptr(pageSize), uintptr(unsafe.Pointer(&v)))
		if errno == 0 && v&1 == 0 {
			return true
		}
	}
	return false
}
