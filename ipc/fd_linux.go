//go:build linux

package ipc

import (
	"fmt"
	"syscall"

	"github.com/cudamem/cudamem/cuda"
)

// recvFlags makes the kernel set close-on-exec on received descriptors as
// it installs them, so a concurrent fork cannot inherit them.
const recvFlags = syscall.MSG_CMSG_CLOEXEC

func setCloexec([]int) error { return nil }

// Socket options that make the kernel attach control messages of its own
// to every message received: credentials (SO_PASSCRED), the sender's
// pidfd (SO_PASSPIDFD, Linux 6.5 and later; 76 on every architecture Go's
// compiler targets), its security label (SO_PASSSEC) and receive
// timestamps (SO_TIMESTAMP, SO_TIMESTAMPNS, SO_TIMESTAMPING). They would take the control-message room kept for the
// descriptors (so a frame's descriptors arrive truncated), and a pidfd is
// a descriptor this package would have to close unseen by its caller.
const (
	soPassCred  = syscall.SO_PASSCRED
	soPassSec   = syscall.SO_PASSSEC
	soPassPIDFD = 76
)

// checkRecvOpts refuses a receiving socket with one of those options set.
// A kernel that does not know an option (ENOPROTOOPT) does not have it on.
func checkRecvOpts(fd int) error {
	for _, o := range []struct {
		opt  int
		name string
	}{{soPassCred, "SO_PASSCRED"}, {soPassPIDFD, "SO_PASSPIDFD"}, {soPassSec, "SO_PASSSEC"},
		{syscall.SO_TIMESTAMP, "SO_TIMESTAMP"}, {syscall.SO_TIMESTAMPNS, "SO_TIMESTAMPNS"}, {syscall.SO_TIMESTAMPING, "SO_TIMESTAMPING"}} {
		v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, o.opt)
		if err == nil && v != 0 {
			return fmt.Errorf("%w: the receiving socket has %s set, so the kernel attaches a control message of its own to every message, taking the room kept for descriptors; clear it (setsockopt %s 0) before receiving", cuda.ErrInvalidArgument, o.name, o.name)
		}
	}
	return nil
}
