//go:build !unix

package osfd

import (
	"errors"

	"github.com/cudamem/cudamem/cuda"
)

func supported(op string) error {
	return cuda.Errorf(op, cuda.ErrNotSupported, "POSIX file descriptors need a Unix system")
}

func closeFD(int) error { return supported("osfd.Close") }

func dupCloexec(int) (int, error) { return -1, supported("osfd.Dup") }

func joinErrs(errs []error) error { return errors.Join(errs...) }

func checkOpen(int) error { return supported("osfd.New") }

func setCloexec(int) error { return supported("osfd.New") }
