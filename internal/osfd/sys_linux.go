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

// anonInodeFSMagic is ANON_INODE_FS_MAGIC (linux/magic.h), the statfs type
// of the anonymous-inode file system.
const anonInodeFSMagic = 0x09041934

// anonInode reports whether fd's file lives on the anonymous-inode file
// system (an eventfd, a driver's object fd), whatever mode its inode
// reports.
func anonInode(fd int) bool {
	var fs unix.Statfs_t
	return unix.Fstatfs(fd, &fs) == nil && fs.Type == anonInodeFSMagic
}
