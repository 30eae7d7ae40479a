//go:build unix

package osfd

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

func supported(string) error { return nil }

// closeFD closes fd. EINTR is not retried: on Linux and the BSDs the
// descriptor is released even then, and retrying could close a number
// another goroutine has just been given.
func closeFD(fd int) error { return syscall.Close(fd) }

func joinErrs(errs []error) error { return errors.Join(errs...) }

// checkOpen reports an error when fd is not an open descriptor, so that
// New never takes ownership of a number that a later open may reuse
// (closing it then would close someone else's file).
func checkOpen(fd int) error {
	var st syscall.Stat_t
	for {
		err := syscall.Fstat(fd, &st)
		if err != syscall.EINTR {
			return err
		}
	}
}

// setCloexec sets FD_CLOEXEC on fd, keeping its other descriptor flags.
func setCloexec(fd int) error {
	flags, err := fcntl(fd, unix.F_GETFD, 0)
	if err != nil {
		return err
	}
	if flags&unix.FD_CLOEXEC != 0 {
		return nil
	}
	_, err = fcntl(fd, unix.F_SETFD, flags|unix.FD_CLOEXEC)
	return err
}

func fcntl(fd, cmd, arg int) (int, error) {
	for {
		r, err := unix.FcntlInt(uintptr(fd), cmd, arg)
		if err != unix.EINTR {
			return r, err
		}
	}
}
