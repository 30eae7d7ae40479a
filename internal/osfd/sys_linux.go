//go:build linux

package osfd

import "golang.org/x/sys/unix"

// dupCloexec duplicates fd with close-on-exec set in one step
// (F_DUPFD_CLOEXEC), so no concurrent fork can inherit the duplicate.
func dupCloexec(fd int) (int, error) {
	for {
		nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, err
		}
		return nfd, nil
	}
}
