//go:build linux

package osfd

import "syscall"

// dupCloexec duplicates fd with close-on-exec set in one step
// (F_DUPFD_CLOEXEC), so no concurrent fork can inherit the duplicate.
func dupCloexec(fd int) (int, error) {
	for {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), nil
	}
}
