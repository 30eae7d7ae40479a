//go:build !linux

package ipc

import "github.com/cudamem/cudamem/cuda"

// FDIdentity is not supported here: pool IPC by POSIX fd is Linux only.
func FDIdentity(fd int) (UUID, error) {
	return UUID{}, cuda.Errorf("ipc.FDIdentity", cuda.ErrNotSupported, "pool fds identify pools only on Linux")
}
