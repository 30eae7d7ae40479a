//go:build unix

package osfd

import (
	"errors"
	"syscall"
)

func supported(string) error { return nil }

// closeFD closes fd. EINTR is not retried: on Linux and the BSDs the
// descriptor is released even then, and retrying could close a number
// another goroutine has just been given.
func closeFD(fd int) error { return syscall.Close(fd) }

func joinErrs(errs []error) error { return errors.Join(errs...) }
