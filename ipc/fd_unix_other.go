//go:build unix && !linux

package ipc

import (
	"fmt"
	"syscall"

	"github.com/cudamem/cudamem/cuda"
)

const recvFlags = 0

// setCloexec marks received descriptors close-on-exec (systems without
// MSG_CMSG_CLOEXEC leave a short window where a fork can inherit them).
func setCloexec(fds []int) error {
	for _, fd := range fds {
		syscall.CloseOnExec(fd)
	}
	return nil
}

// checkRecvOpts and peekOwnControl check nothing: the options that attach
// control messages of the kernel's own are known for Linux only. One that
// arrives is still refused (errControlMessage).
func checkRecvOpts(int) error  { return nil }
func peekOwnControl(int) error { return nil }

func errControlMessage(level, typ int32) error {
	return fmt.Errorf("%w: the kernel attached a control message of level %d, type %d to the message (a socket option of the receiving socket asks for it): clear that option before receiving", cuda.ErrInvalidArgument, level, typ)
}

func controlFDs(level, typ int32) bool {
	return level == syscall.SOL_SOCKET && typ == syscall.SCM_RIGHTS
}
