//go:build linux

package ipc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/cudamem/cudamem/cuda"
)

// anonInodeFSMagic is ANON_INODE_FS_MAGIC (linux/magic.h), the statfs type
// of the anonymous-inode file system.
const anonInodeFSMagic = 0x09041934

// fdIdentity derives a stable UUID for the file fd refers to, from its
// device and inode numbers: descriptors of one open file give the same
// UUID. While a pool is imported, the duplicate ImportPool keeps holds the
// file open, so its inode number cannot be reused meanwhile.
//
// Device nodes and anonymous inodes, whose inode unrelated objects share,
// cannot identify a pool: the error matches cuda.ErrNotSupported; other
// failures (a closed fd) wrap the fstat error.
func fdIdentity(fd int) (UUID, error) {
	const op = "ipc.NewForeignHandle"
	if fd < 0 {
		return UUID{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return UUID{}, &cuda.OpError{Op: op, Err: fmt.Errorf("fstat of fd %d: %w", fd, err)}
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFCHR, syscall.S_IFBLK:
		return UUID{}, cuda.Errorf(op, cuda.ErrNotSupported, "fd %d is a device node (rdev %#x): every open of it shares one inode, which names no pool", fd, uint64(st.Rdev))
	}
	// Anonymous inodes all live on one pseudo file system: fstatfs tells
	// them apart without /proc (which a sandbox may not have; a failed
	// check must not pass them as identities).
	var fs syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &fs); err != nil {
		return UUID{}, cuda.Errorf(op, cuda.ErrNotSupported, "fd %d: cannot tell whether it is an anonymous inode (fstatfs: %v)", fd, err)
	}
	if fs.Type == anonInodeFSMagic {
		target, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)) // for the message only
		return UUID{}, cuda.Errorf(op, cuda.ErrNotSupported, "fd %d is an anonymous inode (%s), shared by unrelated files", fd, target)
	}
	if target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil && strings.HasPrefix(target, "anon_inode:") {
		return UUID{}, cuda.Errorf(op, cuda.ErrNotSupported, "fd %d is an anonymous inode (%s), shared by unrelated files", fd, target)
	}
	return identityUUID(uint64(st.Dev), uint64(st.Ino)), nil
}
