//go:build linux

package ipc

import "syscall"

// recvFlags makes the kernel set close-on-exec on received descriptors as
// it installs them, so a concurrent fork cannot inherit them.
const recvFlags = syscall.MSG_CMSG_CLOEXEC

func setCloexec([]int) error { return nil }

// anonInode reports whether fd's file lives on the anonymous-inode file
// system (an eventfd, a driver's object fd), whatever mode its inode
// reports.
func anonInode(fd int) bool {
	var fs syscall.Statfs_t
	return syscall.Fstatfs(fd, &fs) == nil && fs.Type == anonInodeFSMagic
}
