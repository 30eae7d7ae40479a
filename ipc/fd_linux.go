//go:build linux

package ipc

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
)

// recvFlags makes the kernel set close-on-exec on received descriptors as
// it installs them, so a concurrent fork cannot inherit them.
const recvFlags = syscall.MSG_CMSG_CLOEXEC

func setCloexec([]int) error { return nil }

// soINQ is SO_INQ, and SCM_INQ the control message it attaches (Linux
// 6.17 and later; 84 on every architecture). The kernel does not report
// it, so only peekOwnControl finds it.
const soINQ = 84

// recvOpt is a socket option (level SOL_SOCKET) that makes the kernel
// attach a control message of its own to received messages, and the type
// of that message.
type recvOpt struct {
	opt  int
	cmsg int32
	name string
}

// recvOpts are the options a receiving socket is refused with, in the
// order they are read: of those that read as set together, the first
// named is the one the caller set (SO_TIMESTAMPNS_NEW reads back as
// SO_TIMESTAMP_NEW too, and SO_TIMESTAMPING_NEW as SO_TIMESTAMPING). The
// last four attach nothing to AF_UNIX messages today, but would take the
// descriptors' room as the others do if a kernel extended them to it.
var recvOpts = []recvOpt{
	{unix.SO_PASSCRED, unix.SCM_CREDENTIALS, "SO_PASSCRED"},
	{unix.SO_PASSPIDFD, unix.SCM_PIDFD, "SO_PASSPIDFD"},
	{unix.SO_PASSSEC, unix.SCM_SECURITY, "SO_PASSSEC"},
	{unix.SO_TIMESTAMPNS_NEW, unix.SO_TIMESTAMPNS_NEW, "SO_TIMESTAMPNS_NEW"},
	{unix.SO_TIMESTAMP_NEW, unix.SO_TIMESTAMP_NEW, "SO_TIMESTAMP_NEW"},
	{unix.SO_TIMESTAMPING_NEW, unix.SO_TIMESTAMPING_NEW, "SO_TIMESTAMPING_NEW"},
	{unix.SO_TIMESTAMPNS_OLD, unix.SO_TIMESTAMPNS_OLD, "SO_TIMESTAMPNS"},
	{unix.SO_TIMESTAMP_OLD, unix.SO_TIMESTAMP_OLD, "SO_TIMESTAMP"},
	{unix.SO_TIMESTAMPING_OLD, unix.SO_TIMESTAMPING_OLD, "SO_TIMESTAMPING"},
	{unix.SO_RXQ_OVFL, unix.SO_RXQ_OVFL, "SO_RXQ_OVFL"},
	{unix.SO_WIFI_STATUS, unix.SCM_WIFI_STATUS, "SO_WIFI_STATUS"},
	{unix.SO_RCVMARK, unix.SO_MARK, "SO_RCVMARK"},
	{unix.SO_RCVPRIORITY, unix.SO_PRIORITY, "SO_RCVPRIORITY"},
	{soINQ, soINQ, "SO_INQ"},
}

// errOwnControl is the refusal of a socket whose kernel attaches control
// messages of its own, for option name.
func errOwnControl(name string) error {
	return fmt.Errorf("%w: the receiving socket has %s set, so the kernel attaches a control message of its own to every message, taking the room kept for descriptors; clear it (setsockopt %s 0) before receiving", cuda.ErrInvalidArgument, name, name)
}

// checkRecvOpts refuses a receiving socket with one of recvOpts set,
// before anything is read. An option the kernel does not report is not
// taken as set: peekOwnControl still catches what it attaches.
func checkRecvOpts(fd int) error {
	for _, o := range recvOpts {
		v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, o.opt)
		if err == nil && v != 0 {
			return errOwnControl(o.name)
		}
	}
	return nil
}

// peekOwnControl looks at the next message without taking it off the
// socket (MSG_PEEK) with room for one control-message header and no more:
// no descriptor fits there (the kernel installs none), so a header that
// arrives is a control message of the kernel's own, and the socket is
// refused before the real read. Nothing to peek at is left to the real
// read.
func peekOwnControl(fd int) error {
	var one [1]byte
	var oob [syscall.SizeofCmsghdr]byte
	for {
		_, oobn, _, _, err := syscall.Recvmsg(fd, one[:], oob[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || oobn < syscall.SizeofCmsghdr {
			return nil
		}
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		return errControlMessage(h.Level, h.Type)
	}
}

// errControlMessage names a control message other than SCM_RIGHTS that
// arrived (or was about to) with a message: by the option that makes the
// kernel attach it when it is one of recvOpts.
func errControlMessage(level, typ int32) error {
	if level == syscall.SOL_SOCKET {
		for _, o := range recvOpts {
			if o.cmsg == typ {
				return errOwnControl(o.name)
			}
		}
	}
	return fmt.Errorf("%w: the kernel attached a control message of level %d, type %d to the message (a socket option of the receiving socket asks for it): clear that option before receiving", cuda.ErrInvalidArgument, level, typ)
}

// controlFDs reports whether a control message carries descriptors this
// process now holds: SCM_RIGHTS, and SCM_PIDFD (refused and closed).
func controlFDs(level, typ int32) bool {
	return level == syscall.SOL_SOCKET && (typ == syscall.SCM_RIGHTS || typ == unix.SCM_PIDFD)
}
