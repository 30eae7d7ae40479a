//go:build unix

package osfd

import (
	"fmt"
	"syscall"

	"github.com/cudamem/cudamem/cuda"
)

// CheckExport refuses a descriptor that cannot be something the CUDA
// driver exported (what names it: "a pool", "a VMM allocation"), before
// the driver or an owner takes it. Package ipc checks pool handles with
// it, and package virtual the chunks of a VMM import: both come from
// another process, and are hostile input.
//
// On Linux the driver's POSIX-fd exports (cuMemPoolExportToShareableHandle,
// cuMemExportToShareableHandle) are descriptors of its control device: a
// character device, or an anonymous inode. What arrives from another
// process may be anything, and some kinds do harm in the driver's hands or
// in ours: a pipe or FIFO whose other end a peer holds, a socket, a
// regular file or directory (a path into the file system), a symbolic link
// (O_PATH) or a block device. So those are refused by kind, with an error
// naming op and matching cuda.ErrInvalidArgument; every other kind
// (character devices, anonymous inodes, kinds unknown here) is left to the
// driver, which refuses what it did not make. A regular file on the
// anonymous-inode file system is an anonymous inode (kernels may report
// those as regular files) and is accepted. A descriptor that is not open
// is refused too (the fstat error, wrapped).
func CheckExport(op string, fd int, what string) error {
	if fd < 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	var st syscall.Stat_t
	for {
		err := syscall.Fstat(fd, &st)
		if err == nil {
			break
		}
		if err != syscall.EINTR {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("fstat of file descriptor %d: %w", fd, err)}
		}
	}
	var kind string
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFIFO:
		kind = "pipe or FIFO"
	case syscall.S_IFSOCK:
		kind = "socket"
	case syscall.S_IFDIR:
		kind = "directory"
	case syscall.S_IFLNK:
		kind = "symbolic link"
	case syscall.S_IFBLK:
		kind = "block device"
	case syscall.S_IFREG:
		if anonInode(fd) {
			return nil
		}
		kind = "regular file"
	default:
		return nil
	}
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "file descriptor %d is a %s (mode %#o), not %s exported by the driver (a character device or anonymous inode)", fd, kind, uint32(st.Mode), what)
}
