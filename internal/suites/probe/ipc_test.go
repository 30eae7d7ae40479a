//go:build linux

package probe

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/ipc"
)

// pair returns two connected *net.UnixConn of the given socket type.
func pair(t *testing.T, typ int) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, typ|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sock")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := mk(fds[0]), mk(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func rawSend(t *testing.T, c *net.UnixConn, msg []byte, nfds int) {
	t.Helper()
	var oob []byte
	if nfds > 0 {
		fds := make([]int, nfds)
		for i := range fds {
			f, err := os.Open("/dev/null")
			if err != nil {
				t.Fatal(err)
			}
			fds[i] = int(f.Fd())
			defer f.Close()
		}
		oob = syscall.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(msg, oob, nil); err != nil {
		t.Fatal(err)
	}
}

func frame(payload []byte, nfds uint32) []byte {
	b := []byte("cmF1")
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = binary.LittleEndian.AppendUint32(b, nfds)
	return append(b, payload...)
}

func TestReceiveGarbage(t *testing.T) {
	for _, typ := range []int{syscall.SOCK_STREAM, syscall.SOCK_SEQPACKET, syscall.SOCK_DGRAM} {
		cases := []struct {
			name string
			msg  []byte
			nfds int
		}{
			{"garbage", []byte("hello world!!"), 3},
			{"short", []byte("cm"), 2},
			{"count mismatch", frame([]byte("x"), 5), 2},
			{"too many fds", frame([]byte("x"), 100), 100},
			{"huge len", frame(nil, 0)[:4:4], 1},
			{"handle payload no fd", frame(bytes.Repeat([]byte{0}, 60), 0), 0},
			{"handle garbage 1 fd", frame(bytes.Repeat([]byte{7}, 60), 1), 1},
			{"handle two fds", frame(bytes.Repeat([]byte{7}, 60), 2), 2},
		}
		for _, c := range cases {
			a, b := pair(t, typ)
			before := len(testutil.FDs(t))
			msg := c.msg
			if c.name == "huge len" {
				msg = binary.LittleEndian.AppendUint32(append([]byte{}, "cmF1"...), 0xffffffff)
				msg = binary.LittleEndian.AppendUint32(msg, 1)
			}
			rawSend(t, a, msg, c.nfds)
			if typ == syscall.SOCK_STREAM {
				a.CloseWrite()
			}
			b.SetReadDeadline(time.Now().Add(2 * time.Second))
			h, err := ipc.ReceiveHandle(context.Background(), b)
			if err == nil {
				t.Errorf("type %d %s: ReceiveHandle accepted: %v", typ, c.name, h)
				h.Close()
			} else {
				wantErr(t, c.name, err, "ipc.Receive")
			}
			if got := len(testutil.FDs(t)); got != before {
				t.Errorf("type %d %s: %d fds open, %d before (%v)", typ, c.name, got, before, err)
			}
		}
	}
}

func TestReceiveClosedConn(t *testing.T) {
	a, b := pair(t, syscall.SOCK_STREAM)
	b.Close()
	if _, _, err := ipc.ReceiveFDs(context.Background(), b, 10); err == nil {
		t.Errorf("ReceiveFDs on a closed conn: no error")
	} else {
		wantErr(t, "closed", err, "ipc.ReceiveFDs")
		t.Log(err)
	}
	if err := ipc.SendFDs(b, []byte("x")); err == nil {
		t.Errorf("SendFDs on a closed conn: no error")
	}
	// peer closed: EOF
	a2, b2 := pair(t, syscall.SOCK_SEQPACKET)
	a2.Close()
	b2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, _, err := ipc.ReceiveFDs(context.Background(), b2, 10); err == nil {
		t.Errorf("ReceiveFDs after peer close: no error")
	} else {
		t.Log(err)
	}
	_ = a
	// zero UnixConn
	noPanic(t, "zero conn", func() {
		_, _, err := ipc.ReceiveFDs(context.Background(), &net.UnixConn{}, 10)
		if err == nil {
			t.Errorf("zero conn: no error")
		}
		if err := ipc.SendFDs(&net.UnixConn{}, nil); err == nil {
			t.Errorf("zero conn send: no error")
		}
	})
	// Sending a closed fd, many fds, fd -1
	a3, _ := pair(t, syscall.SOCK_STREAM)
	if err := ipc.SendFDs(a3, nil, 1<<30); err == nil {
		t.Errorf("SendFDs bad fd: no error")
	} else {
		wantErr(t, "badfd", err, "ipc.SendFDs")
	}
}

func TestUnmarshalHostile(t *testing.T) {
	var d ipc.Descriptor
	good, _ := ipc.Descriptor{Size: 10}.MarshalBinary()
	for _, b := range [][]byte{nil, {}, good[:len(good)-1], append(append([]byte{}, good...), 0), bytes.Repeat([]byte{0xff}, len(good))} {
		noPanic(t, "desc", func() {
			if err := d.UnmarshalBinary(b); err == nil {
				t.Errorf("Descriptor.UnmarshalBinary(%d bytes) accepted", len(b))
			} else {
				wantErr(t, "desc", err, "")
			}
		})
	}
	var l ipc.LegacyHandle
	lg, _ := ipc.LegacyHandle{Size: 10}.MarshalBinary()
	for _, b := range [][]byte{nil, {}, lg[:len(lg)-1], append(append([]byte{}, lg...), 0), lg[:8]} {
		noPanic(t, "legacy", func() {
			if err := l.UnmarshalBinary(b); err == nil {
				t.Errorf("LegacyHandle.UnmarshalBinary(%d bytes) accepted", len(b))
			}
		})
	}
	for _, s := range []string{"", "x", "00000000-0000-0000-0000-00000000000g", "000000000000000000000000000000000000"} {
		noPanic(t, "uuid", func() {
			if _, err := cuda.ParseUUID(s); err == nil {
				t.Errorf("ParseUUID(%q) accepted", s)
			}
		})
	}
}
