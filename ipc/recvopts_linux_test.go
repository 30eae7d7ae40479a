//go:build linux

package ipc

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testutil"
)

// A receiving socket with SO_PASSCRED (or SO_PASSPIDFD, SO_PASSSEC, a
// timestamp option) set gets control messages of the kernel's own beside
// the descriptors: every
// receive refuses it by name, before anything is taken off the socket,
// and once the option is cleared the same message arrives whole.
func TestReceiveRefusesPassCred(t *testing.T) {
	for _, typ := range []struct {
		name string
		typ  int
	}{{"stream", syscall.SOCK_STREAM}, {"seqpacket", syscall.SOCK_SEQPACKET}, {"dgram", syscall.SOCK_DGRAM}} {
		t.Run(typ.name, func(t *testing.T) {
			before := len(testutil.OpenFDs())
			a, b := unixPair(t, typ.typ)
			r, w := pipePair(t)
			require.NoError(t, SendFDs(a, []byte("frame"), r))
			require.NoError(t, SendMsg(a, []byte("plain"), w))

			set := func(opt, v int) {
				rc, err := b.SyscallConn()
				require.NoError(t, err)
				var serr error
				require.NoError(t, rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, v)
				}))
				require.NoError(t, serr)
			}
			for _, o := range []struct {
				opt  int
				name string
			}{{syscall.SO_PASSCRED, "SO_PASSCRED"}, {syscall.SO_TIMESTAMP, "SO_TIMESTAMP"}} {
				set(o.opt, 1)
				_, fds, err := ReceiveFDs(b, 64)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Contains(t, err.Error(), o.name)
				assert.Empty(t, fds)
				_, fds, err = ReceiveMsg(b, 64, 1)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Contains(t, err.Error(), o.name)
				assert.Empty(t, fds)
				set(o.opt, 0)
			}

			p, fds, err := ReceiveFDs(b, 64)
			require.NoError(t, err)
			assert.Equal(t, "frame", string(p))
			require.Len(t, fds, 1)
			syscall.Close(fds[0])
			p, fds, err = ReceiveMsg(b, 64, 1)
			require.NoError(t, err)
			assert.Equal(t, "plain", string(p))
			require.Len(t, fds, 1)
			syscall.Close(fds[0])
			a.Close()
			b.Close()
			// The pipe's two ends stay open until the test's cleanup.
			assert.LessOrEqual(t, len(testutil.OpenFDs()), before+2, "no descriptor left open")
		})
	}
}
