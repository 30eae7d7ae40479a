//go:build linux

package ipc

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

var socketTypes = map[string]int{
	"stream":    syscall.SOCK_STREAM,
	"seqpacket": syscall.SOCK_SEQPACKET,
	"dgram":     syscall.SOCK_DGRAM,
}

// rawFD returns the descriptor under a UnixConn, for sending crafted
// messages with syscall.Sendmsg.
func rawFD(t *testing.T, c *net.UnixConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	var fd int
	require.NoError(t, rc.Control(func(u uintptr) { fd = int(u) }))
	return fd
}

// pipeFDs returns n open descriptors (pipe read ends), closed at cleanup.
func pipeFDs(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for range n {
		var p [2]int
		require.NoError(t, syscall.Pipe(p[:]))
		require.NoError(t, syscall.Close(p[1]))
		out = append(out, p[0])
	}
	t.Cleanup(func() {
		for _, fd := range out {
			syscall.Close(fd)
		}
	})
	return out
}

func frame(payload []byte, nfds int) []byte {
	b := make([]byte, frameHeader+len(payload))
	copy(b, frameMagic[:])
	binary.LittleEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[8:], uint32(nfds))
	copy(b[frameHeader:], payload)
	return b
}

// TestLongMessagesKeepTheirBoundaries: on every socket type a long payload
// arrives whole, with its descriptor, and the next message is not mixed
// into it. Before messages were framed, a SOCK_STREAM read cut the long
// payload at the receive buffer and read its rest as the next message.
func TestLongMessagesKeepTheirBoundaries(t *testing.T) {
	for name, typ := range socketTypes {
		t.Run(name, func(t *testing.T) {
			a, b := socketPairOf(t, typ)
			size := 200 << 10
			if typ != syscall.SOCK_STREAM {
				size = 60 << 10 // one datagram must fit the socket buffer
			}
			long := bytes.Repeat([]byte("0123456789abcdef"), size/16)
			fds := pipeFDs(t, 2)
			before := testutil.FDs(t)
			done := make(chan error, 1)
			go func() {
				err := SendFDs(a, long, fds...)
				if err == nil {
					err = SendFDs(a, []byte("second"), fds[0])
				}
				if err == nil {
					err = SendFDs(a, nil)
				}
				done <- err
			}()
			got, gfds, err := ReceiveFDs(context.Background(), b, len(long))
			require.NoError(t, err)
			assert.Equal(t, len(long), len(got))
			assert.True(t, bytes.Equal(long, got), "payload intact")
			require.Len(t, gfds, 2)
			got2, gfds2, err := ReceiveFDs(context.Background(), b, len(long))
			require.NoError(t, err)
			assert.Equal(t, "second", string(got2))
			require.Len(t, gfds2, 1)
			got3, gfds3, err := ReceiveFDs(context.Background(), b, 16)
			require.NoError(t, err)
			assert.Empty(t, got3, "an empty payload stays empty")
			assert.Empty(t, gfds3)
			require.NoError(t, <-done)
			for _, fd := range append(gfds, gfds2...) {
				r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
				require.Zero(t, e)
				assert.NotZero(t, r&syscall.FD_CLOEXEC, "received descriptors are close-on-exec")
				require.NoError(t, syscall.Close(fd))
			}
			testutil.AssertNoNewFDs(t, before)
		})
	}
}

// TestReceiveRefusesAndCloses: every malformed message is refused and
// every descriptor that came with it is closed.
func TestReceiveRefusesAndCloses(t *testing.T) {
	type msg struct {
		data []byte
		nfds int
	}
	cases := map[string]struct {
		msgs       []msg
		maxPayload int
		want       string
	}{
		"payload too long":       {[]msg{{frame(make([]byte, 100), 2), 2}}, 10, "payload of"},
		"more fds than framed":   {[]msg{{frame([]byte("x"), 1), 3}}, 10, "3 file descriptors received"},
		"fewer fds than framed":  {[]msg{{frame([]byte("x"), 2), 1}}, 10, "1 file descriptors received"},
		"no frame":               {[]msg{{[]byte("hello, world"), 2}}, 64, "no ipc.SendFDs frame"},
		"fds over MaxFDs":        {[]msg{{frame([]byte("x"), MaxFDs+8), MaxFDs + 8}}, 10, "file descriptors"},
		"absurd fd count framed": {[]msg{{frame([]byte("x"), 1<<20), 1}}, 10, "announced"},
	}
	for name, tc := range cases {
		for tname, typ := range socketTypes {
			t.Run(name+"/"+tname, func(t *testing.T) {
				a, b := socketPairOf(t, typ)
				for _, m := range tc.msgs {
					fds := pipeFDs(t, m.nfds)
					var oob []byte
					if len(fds) > 0 {
						oob = syscall.UnixRights(fds...)
					}
					require.NoError(t, syscall.Sendmsg(rawFD(t, a), m.data, oob, nil, 0))
					for _, fd := range fds {
						require.NoError(t, syscall.Close(fd))
					}
				}
				sent := testutil.FDs(t)
				_, fds, err := ReceiveFDs(context.Background(), b, tc.maxPayload)
				require.Error(t, err)
				assert.Nil(t, fds)
				assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Contains(t, err.Error(), tc.want)
				testutil.AssertNoNewFDs(t, sent, "every received descriptor was closed")
				a.Close()
				b.Close()
			})
		}
	}
}

func TestReceiveEOFAndArguments(t *testing.T) {
	a, b := socketPairOf(t, syscall.SOCK_STREAM)
	require.NoError(t, a.Close())
	_, _, err := ReceiveFDs(context.Background(), b, 10)
	require.Error(t, err)
	_, _, err = ReceiveFDs(context.Background(), b, -1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	c, _ := socketPairOf(t, syscall.SOCK_STREAM)
	assert.ErrorIs(t, SendFDs(c, nil, -1), cuda.ErrInvalidArgument)

	// A header promising more than arrives before EOF.
	x, y := socketPairOf(t, syscall.SOCK_STREAM)
	_, err = x.Write(frame([]byte("abc"), 0)[:frameHeader+1])
	require.NoError(t, err)
	require.NoError(t, x.Close())
	_, _, err = ReceiveFDs(context.Background(), y, 10)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unexpected EOF")
}

// TestReceiveHandleRefusesMalformed: a handle message carrying other than
// one fd, or a payload other than this version's handle encoding (the
// UUID-only payload of version 1 included: it has no key), is refused and
// every descriptor it carried is closed.
func TestReceiveHandleRefusesMalformed(t *testing.T) {
	u := cuda.NewUUID()
	good := encodeHandle(u, newPoolKey())
	edit := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	cases := map[string]struct {
		payload []byte
		nfds    int
		want    string
	}{
		"two fds":                {good, 2, "at most 1 expected"},
		"no fd":                  {good, 0, "got 0 fds"},
		"version 1 (UUID only)":  {u[:], 1, "handle message of 16 bytes"},
		"magic":                  {edit(func(b []byte) { b[0] = 'X' }), 1, "not a handle message"},
		"version 3":              {edit(func(b []byte) { b[8] = 3 }), 1, "version 3"},
		"unknown flag":           {edit(func(b []byte) { b[handleFlagsOffset] |= 2 }), 1, "unknown handle message flags"},
		"key bytes without flag": {edit(func(b []byte) { b[handleFlagsOffset] = 0 }), 1, "key bytes in a handle message without a key"},
		"long":                   {append(bytes.Clone(good), 0), 1, "payload of"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a, b := socketPair(t)
			fds := pipeFDs(t, tc.nfds)
			require.NoError(t, SendFDs(a, tc.payload, fds...))
			sent := testutil.FDs(t)
			h, err := ReceiveHandle(context.Background(), b)
			assert.Nil(t, h)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
			testutil.AssertNoNewFDs(t, sent, "every received descriptor was closed")
		})
	}
}

// TestSendReceiveHandleKey: the pool key travels with the fd over the
// socket (so the receiver authenticates the pool's descriptors), and a
// keyless Handle arrives keyless.
func TestSendReceiveHandleKey(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		a, b := socketPair(t)
		h, err := NewHandle(poolLikeFD(t), cuda.NewUUID().String())
		require.NoError(t, err)
		if keyed {
			h.key = newPoolKey()
		}
		before := testutil.FDs(t)
		require.NoError(t, SendHandle(a, h))
		got, err := ReceiveHandle(context.Background(), b)
		require.NoError(t, err)
		assert.Equal(t, h.UUID(), got.UUID())
		assert.Equal(t, keyed, got.HasKey())
		assert.True(t, got.key.equal(h.key), "the same key (or none)")
		assert.Equal(t, h.Token(), got.Token())
		require.NoError(t, got.Close())
		require.NoError(t, h.Close())
		testutil.AssertNoNewFDs(t, before)
	}
	a, _ := socketPair(t)
	assert.ErrorIs(t, SendHandle(a, nil), cuda.ErrInvalidArgument)
	assert.ErrorIs(t, SendHandle(a, &Handle{}), cuda.ErrInvalidArgument)
}

// FuzzReceiveFDs sends arbitrary bytes with n descriptors attached through
// a socketpair and receives them: whatever happens, no descriptor leaks and
// nothing panics; an accepted message carries what its frame announced.
func FuzzReceiveFDs(f *testing.F) {
	f.Add(frame([]byte("hello"), 1), uint8(1), true, 64)
	f.Add(frame([]byte("hello"), 1), uint8(3), false, 64)
	f.Add([]byte("junk"), uint8(2), true, 8)
	f.Add(frame(make([]byte, 40), 0), uint8(0), false, 8)
	f.Add(frame(nil, 70), uint8(70), true, 0)
	f.Fuzz(func(t *testing.T, data []byte, nfds uint8, stream bool, maxPayload int) {
		if len(data) == 0 || len(data) > 4096 {
			return // an empty stream write sends nothing; long ones add nothing
		}
		typ := syscall.SOCK_SEQPACKET
		if stream {
			typ = syscall.SOCK_STREAM
		}
		n := int(nfds) % (MaxFDs + 16)
		maxPayload %= 8192
		fds, err := syscall.Socketpair(syscall.AF_UNIX, typ, 0)
		require.NoError(t, err)
		conn := func(fd int) *net.UnixConn {
			f := os.NewFile(uintptr(fd), "socketpair")
			c, err := net.FileConn(f)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			return c.(*net.UnixConn)
		}
		a, b := conn(fds[0]), conn(fds[1])
		defer a.Close()
		defer b.Close()
		before := testutil.FDs(t)
		var attach []int
		for range n {
			var p [2]int
			require.NoError(t, syscall.Pipe(p[:]))
			require.NoError(t, syscall.Close(p[1]))
			attach = append(attach, p[0])
		}
		var oob []byte
		if n > 0 {
			oob = syscall.UnixRights(attach...)
		}
		serr := syscall.Sendmsg(rawFD(t, a), data, oob, nil, 0)
		for _, fd := range attach {
			require.NoError(t, syscall.Close(fd))
		}
		if serr != nil {
			return // e.g. too many fds for the kernel
		}
		// Nothing more will come: a short stream frame ends in EOF.
		require.NoError(t, a.CloseWrite())
		payload, got, err := ReceiveFDs(context.Background(), b, maxPayload)
		if err == nil {
			assert.LessOrEqual(t, len(payload), max(maxPayload, 0))
			require.GreaterOrEqual(t, len(data), frameHeader)
			assert.Equal(t, int(binary.LittleEndian.Uint32(data[8:])), len(got))
			assert.Equal(t, data[frameHeader:frameHeader+len(payload)], payload)
			for _, fd := range got {
				require.NoError(t, syscall.Close(fd))
			}
		} else {
			assert.Nil(t, got)
		}
		b.Close()
		a.Close()
		testutil.AssertNoNewFDs(t, before, "nothing received was left open")
	})
}

// FuzzHandleMessage decodes arbitrary handle payloads: nothing panics; an
// accepted payload re-encodes to the same bytes (one meaning per message),
// and carries a key exactly when its flag says so.
func FuzzHandleMessage(f *testing.F) {
	u := UUID{1, 2, 3, 15: 9}
	f.Add(encodeHandle(u, fixedKey()))
	f.Add(encodeHandle(u, poolKey{}))
	f.Add(u[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		gu, k, err := decodeHandle(b)
		if err != nil {
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			return
		}
		assert.Equal(t, b, encodeHandle(gu, k))
		assert.Equal(t, b[handleFlagsOffset]&handleFlagKeyed != 0, k.has())
	})
}
