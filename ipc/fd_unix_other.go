//go:build unix && !linux

package ipc

import "syscall"

const recvFlags = 0

// setCloexec marks received descriptors close-on-exec (systems without
// MSG_CMSG_CLOEXEC leave a short window where a fork can inherit them).
func setCloexec(fds []int) error {
	for _, fd := range fds {
		syscall.CloseOnExec(fd)
	}
	return nil
}

// checkRecvOpts checks nothing: the options that attach control messages
// of the kernel's own are Linux's.
func checkRecvOpts(int) error { return nil }
