//go:build linux

package ipc

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
)

// kernelControlOpts are the options that make the kernel attach control
// messages of its own, with the value that turns each on. Every one must
// be refused, by name.
var kernelControlOpts = []struct {
	name string
	opt  int
	val  int
}{
	{"SO_PASSCRED", unix.SO_PASSCRED, 1},
	{"SO_PASSPIDFD", unix.SO_PASSPIDFD, 1},
	{"SO_PASSSEC", unix.SO_PASSSEC, 1},
	{"SO_TIMESTAMP", unix.SO_TIMESTAMP_OLD, 1},
	{"SO_TIMESTAMPNS", unix.SO_TIMESTAMPNS_OLD, 1},
	{"SO_TIMESTAMPING", unix.SO_TIMESTAMPING_OLD, unix.SOF_TIMESTAMPING_RX_SOFTWARE | unix.SOF_TIMESTAMPING_SOFTWARE},
	{"SO_TIMESTAMP_NEW", unix.SO_TIMESTAMP_NEW, 1},
	{"SO_TIMESTAMPNS_NEW", unix.SO_TIMESTAMPNS_NEW, 1},
	{"SO_TIMESTAMPING_NEW", unix.SO_TIMESTAMPING_NEW, unix.SOF_TIMESTAMPING_RX_SOFTWARE | unix.SOF_TIMESTAMPING_SOFTWARE},
	{"SO_RXQ_OVFL", unix.SO_RXQ_OVFL, 1},
	{"SO_WIFI_STATUS", unix.SO_WIFI_STATUS, 1},
	{"SO_RCVMARK", unix.SO_RCVMARK, 1},
	{"SO_RCVPRIORITY", unix.SO_RCVPRIORITY, 1},
	{"SO_INQ", soINQ, 1},
}

var socketTypeNames = []struct {
	name string
	typ  int
}{{"stream", syscall.SOCK_STREAM}, {"seqpacket", syscall.SOCK_SEQPACKET}, {"dgram", syscall.SOCK_DGRAM}}

// setOpt sets a SOL_SOCKET option on c; false if the kernel does not take
// it on this socket type (SO_INQ on packet sockets, an older kernel).
func setOpt(t *testing.T, c *net.UnixConn, opt, v int) bool {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, v)
	}))
	if v != 0 && (errors.Is(serr, syscall.ENOPROTOOPT) || errors.Is(serr, syscall.EOPNOTSUPP) || errors.Is(serr, syscall.EINVAL)) {
		return false
	}
	require.NoError(t, serr)
	return true
}

// recvWait bounds each receive of these tests: a message that was taken
// off the socket and lost shows as a receive that times out, not as a
// test that hangs.
const recvWait = 5 * time.Second

// receiveEntryPoints are every receive of the package, each as it is
// refused: framed and plain, with a context that ends and with
// context.Background(), which leaves the connection's read deadline
// (recvWait) in force.
var receiveEntryPoints = []struct {
	name string
	recv func(c *net.UnixConn) ([]int, error)
}{
	{"ReceiveFDs", func(c *net.UnixConn) ([]int, error) {
		c.SetReadDeadline(time.Now().Add(recvWait))
		_, fds, err := ReceiveFDs(context.Background(), c, 256)
		return fds, err
	}},
	{"ReceiveFDs", func(c *net.UnixConn) ([]int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), recvWait)
		defer cancel()
		_, fds, err := ReceiveFDs(ctx, c, 256)
		return fds, err
	}},
	{"ReceiveHandle", func(c *net.UnixConn) ([]int, error) {
		c.SetReadDeadline(time.Now().Add(recvWait))
		h, err := ReceiveHandle(context.Background(), c)
		if h != nil {
			h.Close()
			return []int{-1}, err
		}
		return nil, err
	}},
	{"ReceiveHandle", func(c *net.UnixConn) ([]int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), recvWait)
		defer cancel()
		h, err := ReceiveHandle(ctx, c)
		if h != nil {
			h.Close()
			return []int{-1}, err
		}
		return nil, err
	}},
	{"ReceivePlain", func(c *net.UnixConn) ([]int, error) {
		c.SetReadDeadline(time.Now().Add(recvWait))
		_, fds, err := ReceivePlain(context.Background(), c, 256, 1)
		return fds, err
	}},
}

// TestReceiveRefusesKernelControlOptions: a receiving socket with any
// option that makes the kernel attach control messages of its own is
// refused by every receive, naming the option, before anything is taken
// off the socket: once the option is cleared the same messages arrive
// whole, descriptors and all, and no descriptor was left open meanwhile.
// Before, only the old option numbers were read: with SO_TIMESTAMP_NEW
// or SO_TIMESTAMPNS_NEW set (which read back as 0 through the old ones)
// a datagram's timestamp took the room kept for its descriptor, and the
// message was refused as truncated after it had been read, so lost; so
// was a stream's with SO_INQ, which the kernel does not report at all.
func TestReceiveRefusesKernelControlOptions(t *testing.T) {
	for _, st := range socketTypeNames {
		for _, o := range kernelControlOpts {
			t.Run(st.name+"/"+o.name, func(t *testing.T) {
				a, b := unixPair(t, st.typ)
				if !setOpt(t, b, o.opt, o.val) {
					t.Skipf("the kernel takes no %s on a %s socket", o.name, st.name)
				}
				r, w := pipePair(t)
				require.NoError(t, SendFDs(a, []byte("frame"), r))
				require.NoError(t, SendPlain(a, []byte("plain"), w))
				base := fdCount(t)
				for _, e := range receiveEntryPoints {
					fds, err := e.recv(b)
					require.ErrorIs(t, err, cuda.ErrInvalidArgument, "%s", e.name)
					assert.Contains(t, err.Error(), o.name, "%s names the option", e.name)
					assert.Contains(t, err.Error(), "ipc."+e.name, "%s names itself", e.name)
					assert.Empty(t, fds, e.name)
					assert.Equal(t, base, fdCount(t), "%s left no descriptor open", e.name)
				}
				setOpt(t, b, o.opt, 0)

				require.NoError(t, b.SetReadDeadline(time.Now().Add(recvWait)))
				p, fds, err := ReceiveFDs(context.Background(), b, 64)
				require.NoError(t, err, "the frame is still there, whole")
				assert.Equal(t, "frame", string(p))
				require.Len(t, fds, 1)
				assert.NoError(t, osfd.Close(fds[0]))
				p, fds, err = ReceivePlain(context.Background(), b, 64, 1)
				require.NoError(t, err, "the plain message is still there, whole")
				assert.Equal(t, "plain", string(p))
				require.Len(t, fds, 1)
				assert.NoError(t, osfd.Close(fds[0]))
				assert.Equal(t, base, fdCount(t))
			})
		}
	}
}

// withoutRecvChecks turns off the checks before each read for one test,
// standing in for an option set by another goroutine between the check
// and the read: what arrives must then be refused, and closed, after it.
func withoutRecvChecks(t *testing.T) {
	skipRecvChecks = true
	t.Cleanup(func() { skipRecvChecks = false })
}

// TestReceiveClosesEverythingTheKernelAttached: when the kernel's own
// control messages arrive anyway (an option set during the receive),
// every receive refuses the message, naming the option where it can, and
// closes every descriptor that came with it: those of SCM_RIGHTS, whole
// or cut short by truncated control data, and the sender's pidfd that
// SO_PASSPIDFD installs, which the receives did not look at before (it
// stayed open, unseen by the caller, at every receive).
func TestReceiveClosesEverythingTheKernelAttached(t *testing.T) {
	withoutRecvChecks(t)
	for _, st := range socketTypeNames {
		for _, o := range kernelControlOpts {
			switch o.name {
			case "SO_PASSCRED", "SO_PASSPIDFD", "SO_TIMESTAMP", "SO_TIMESTAMPNS", "SO_TIMESTAMP_NEW", "SO_TIMESTAMPNS_NEW", "SO_INQ":
			default:
				continue // the kernel attaches nothing for them to AF_UNIX messages
			}
			for _, e := range receiveEntryPoints {
				t.Run(st.name+"/"+o.name+"/"+e.name, func(t *testing.T) {
					a, b := unixPair(t, st.typ)
					if !setOpt(t, b, o.opt, o.val) {
						t.Skipf("the kernel takes no %s on a %s socket", o.name, st.name)
					}
					r := devNull(t) // a kind ReceiveHandle takes
					base := fdCount(t)
					require.NoError(t, SendFDs(a, handleFrame(1)[frameHeader:], r))
					fds, err := e.recv(b)
					if err == nil {
						// The kernel attached nothing to this message (a
						// stream's timestamps, creds on a stream without
						// SO_PASSCRED's pidfd room): it must be whole.
						assert.Len(t, fds, 1)
						for _, fd := range fds {
							if fd >= 0 {
								osfd.Close(fd)
							}
						}
						t.Logf("nothing attached: received")
					} else {
						require.ErrorIs(t, err, cuda.ErrInvalidArgument)
						assert.Empty(t, fds)
						t.Logf("refused: %v", err)
					}
					assert.Equal(t, base, fdCount(t), "every descriptor that arrived was closed")
				})
			}
		}
	}
}

// TestPeekFindsUnreportedOption: SO_INQ cannot be read back from an
// AF_UNIX socket, so only the peek before the read finds it; a stream
// receive is refused, naming it, with the frame left whole.
func TestPeekFindsUnreportedOption(t *testing.T) {
	a, b := unixPair(t, syscall.SOCK_STREAM)
	if !setOpt(t, b, soINQ, 1) {
		t.Skip("this kernel has no SO_INQ on AF_UNIX stream sockets")
	}
	rc, err := b.SyscallConn()
	require.NoError(t, err)
	var gerr error
	require.NoError(t, rc.Control(func(fd uintptr) { _, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, soINQ) }))
	t.Logf("getsockopt(SO_INQ) on AF_UNIX: %v", gerr)
	require.NoError(t, SendHandle(a, mustHandle(t, devNull(t))))
	base := fdCount(t)
	require.NoError(t, b.SetReadDeadline(time.Now().Add(recvWait)))
	_, err = ReceiveHandle(context.Background(), b)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "SO_INQ")
	assert.Equal(t, base, fdCount(t))
	setOpt(t, b, soINQ, 0)
	require.NoError(t, b.SetReadDeadline(time.Now().Add(recvWait)))
	_, fds, err := ReceiveFDs(context.Background(), b, handleMsgSize)
	require.NoError(t, err, "the frame is still there")
	require.Len(t, fds, 1)
	osfd.Close(fds[0])
}

// devNull opens /dev/null, closed with the test.
func devNull(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	return fd
}

// mustHandle makes a Handle of a duplicate of fd (closed with the test).
func mustHandle(t *testing.T, fd int) *Handle {
	t.Helper()
	f, err := osfd.DupInt(fd)
	require.NoError(t, err)
	nfd, err := f.Release()
	require.NoError(t, err)
	h, err := NewHandle(nfd, cuda.NewUUID().String())
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return h
}

// cmsg builds one control message as the kernel lays it out.
func cmsg(level, typ int32, data []byte, declared int) []byte {
	b := make([]byte, syscall.CmsgSpace(len(data)))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(declared)
	copy(b[syscall.CmsgLen(0):], data)
	return b
}

func fdBytes(fds ...int) []byte {
	b := make([]byte, 4*len(fds))
	for i, fd := range fds {
		binary.NativeEndian.PutUint32(b[4*i:], uint32(int32(fd)))
	}
	return b
}

// TestRightsKeepsEveryDescriptor: whatever the control bytes hold, every
// descriptor in them is handed back for closing, also when an error is
// returned: messages after a refused one, a last message cut short
// (truncated control data), a pidfd. Before, a parse failure anywhere
// dropped every descriptor parsed so far, and descriptors of any message
// but SCM_RIGHTS were ignored (left open).
func TestRightsKeepsEveryDescriptor(t *testing.T) {
	rights1 := cmsg(syscall.SOL_SOCKET, syscall.SCM_RIGHTS, fdBytes(10, 11), syscall.CmsgLen(8))
	ts := cmsg(syscall.SOL_SOCKET, unix.SO_TIMESTAMP_NEW, make([]byte, 16), syscall.CmsgLen(16))
	pidfd := cmsg(syscall.SOL_SOCKET, unix.SCM_PIDFD, fdBytes(12), syscall.CmsgLen(4))
	for _, tc := range []struct {
		name string
		oob  []byte
		fds  []int
		err  string
	}{
		{"rights", rights1, []int{10, 11}, ""},
		{"timestamp first", append(append([]byte{}, ts...), rights1...), []int{10, 11}, "SO_TIMESTAMP_NEW"},
		{"pidfd after rights", append(append([]byte{}, rights1...), pidfd...), []int{10, 11, 12}, "SO_PASSPIDFD"},
		// The kernel's truncation: the header says more than the room held.
		{"cut short", cmsg(syscall.SOL_SOCKET, syscall.SCM_RIGHTS, fdBytes(10, 11), syscall.CmsgLen(40)), []int{10, 11}, ""},
		{"then garbage", append(append([]byte{}, rights1...), make([]byte, syscall.SizeofCmsghdr)...), []int{10, 11}, "shorter than its header"},
		{"unknown level", append(cmsg(syscall.SOL_IP, 8, make([]byte, 12), syscall.CmsgLen(12)), rights1...), []int{10, 11}, "level 0, type 8"},
		{"tail shorter than a header", append(append([]byte{}, rights1...), 1, 2, 3), []int{10, 11}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := rights(tc.oob, []int{7})
			assert.Equal(t, append([]int{7}, tc.fds...), fds, "every descriptor handed back")
			if tc.err == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.err)
		})
	}
}

// TestReceiveClosesTruncatedRights: more descriptors than a receive has
// room for truncate the control data: every descriptor the kernel
// installed is closed, on every receive and socket type.
func TestReceiveClosesTruncatedRights(t *testing.T) {
	for _, st := range socketTypeNames {
		for _, e := range receiveEntryPoints {
			t.Run(st.name+"/"+e.name, func(t *testing.T) {
				peer, conn := newHostilePeer(t, st.typ, MaxFDs+4)
				base := fdCount(t)
				peer.mustSend(handleFrame(MaxFDs+4), MaxFDs+4)
				require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
				fds, err := e.recv(conn)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Empty(t, fds)
				assert.Equal(t, base, fdCount(t), "everything the kernel installed was closed")
			})
		}
	}
}
