//go:build !linux

package ipc

import "github.com/cudamem/cudamem/cuda"

// fdIdentity is not supported here: pool IPC by POSIX fd is Linux only.
func fdIdentity(fd int) (UUID, error) {
	return UUID{}, cuda.Errorf("ipc.NewForeignHandle", cuda.ErrNotSupported, "pool fds identify pools only on Linux")
}
