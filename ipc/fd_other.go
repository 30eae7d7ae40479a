//go:build !unix

package ipc

import (
	"os"

	"github.com/cudamem/cudamem/cuda"
)

func closeFD(fd int) error { return errNoFDs("close") }

func fileOf(fd int, name string) (*os.File, error) { return nil, errNoFDs("ExtraFile") }

func dup(fd int) (int, error) { return -1, errNoFDs("dup") }

func errNoFDs(op string) error {
	return cuda.Errorf("ipc."+op, cuda.ErrNotSupported, "POSIX file descriptor IPC needs a Unix system")
}
