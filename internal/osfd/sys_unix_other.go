//go:build unix && !linux

package osfd

import "syscall"

// dupCloexec duplicates fd with close-on-exec set. Without a portable
// F_DUPFD_CLOEXEC in package syscall, it holds syscall.ForkLock so that no
// exec started through package os can inherit the duplicate before the
// flag is set.
func dupCloexec(fd int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	nfd, err := syscall.Dup(fd)
	if err != nil {
		return -1, err
	}
	syscall.CloseOnExec(nfd)
	return nfd, nil
}

// anonInode reports false: anonymous inodes are told apart on Linux only.
func anonInode(int) bool { return false }
