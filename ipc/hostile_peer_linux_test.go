//go:build linux

package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
)

// The adversarial peer: it writes raw frames with syscall.Sendmsg and
// SCM_RIGHTS, attaching descriptors wherever it likes, and the tests
// count this process's open descriptors (/proc/self/fd) while the
// receiver works, while it is blocked, and after it returns.

// fdCount is the number of open descriptors, the one used to list them
// left out.
func fdCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("cannot count fds without /proc/self/fd")
	}
	return len(ents) - 1
}

// hostilePeer is the sending end of a socketpair and the descriptors it
// attaches (pipe read ends, open before the test's baseline: attaching
// them puts references in flight, not descriptors in this process's
// table, until the receiver installs them).
type hostilePeer struct {
	t    *testing.T
	fd   int
	conn *net.UnixConn
	src  []int
}

func newHostilePeer(t *testing.T, typ, nsrc int) (*hostilePeer, *net.UnixConn) {
	t.Helper()
	a, b := socketPairOf(t, typ)
	return &hostilePeer{t: t, fd: rawFD(t, a), conn: a, src: pipeFDs(t, nsrc)}, b
}

// send writes data with n of the peer's descriptors attached, in one
// sendmsg; it returns the error so that a flood can stop at the kernel's
// limit on descriptors in flight.
func (p *hostilePeer) send(data []byte, n int) error {
	var oob []byte
	if n > 0 {
		oob = syscall.UnixRights(p.src[:n]...)
	}
	return syscall.Sendmsg(p.fd, data, oob, nil, 0)
}

func (p *hostilePeer) mustSend(data []byte, n int) {
	p.t.Helper()
	require.NoError(p.t, p.send(data, n))
}

// handleFrame is a whole, well-formed handle message frame announcing
// nfds descriptors.
func handleFrame(nfds int) []byte {
	return frame(encodeHandle(cuda.NewUUID(), newPoolKey()), nfds)
}

// unread is how many bytes wait in the receiving socket.
func unread(t *testing.T, c *net.UnixConn) int {
	n, err := unix.IoctlGetInt(rawFD(t, c), unix.SIOCINQ)
	require.NoError(t, err)
	return n
}

// waitConsumed waits until the receiver has read everything sent so far
// (it is then blocked for the rest).
func waitConsumed(t *testing.T, c *net.UnixConn) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for unread(t, c) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the receiver left %d bytes unread", unread(t, c))
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond) // past the read of the last bytes
}

// received is what a receive gave its caller: how many descriptors, and
// how to close them.
type received struct {
	n     int
	close func() error
}

// receivers are the two receiving entry points, with the most
// descriptors one call may hold: ReceiveHandle makes room for one (the
// kernel installs at most two there), ReceiveFDs for MaxFDs.
var receivers = map[string]struct {
	recv  func(ctx context.Context, c *net.UnixConn) (*received, error)
	bound int
}{
	"ReceiveHandle": {func(ctx context.Context, c *net.UnixConn) (*received, error) {
		h, err := ReceiveHandle(ctx, c)
		if err != nil {
			return nil, err
		}
		return &received{1, h.Close}, nil
	}, 2},
	"ReceiveFDs": {func(ctx context.Context, c *net.UnixConn) (*received, error) {
		_, fds, err := ReceiveFDs(ctx, c, 1<<20)
		if err != nil {
			return nil, err
		}
		return &received{len(fds), func() error { return osfd.CloseAll(fds) }}, nil
	}, MaxFDs},
}

// TestHostilePeerDescriptorsInEveryChunk: a frame sent a byte at a time
// with descriptors on every byte is refused at its second chunk, with
// everything closed, whether or not the peer withholds the frame's last
// byte. Before, the receiver summed the descriptors of every read and
// compared them with the frame only once the payload was complete: a
// one-descriptor handle frame left it holding ~3,900 descriptors, and a
// peer that withheld the last byte kept them open in a blocked receive.
func TestHostilePeerDescriptorsInEveryChunk(t *testing.T) {
	for name, r := range receivers {
		for _, perChunk := range []int{1, MaxFDs} {
			for _, withhold := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%d per chunk/withhold %v", name, perChunk, withhold), func(t *testing.T) {
					peer, conn := newHostilePeer(t, syscall.SOCK_STREAM, perChunk)
					base := fdCount(t)
					msg := handleFrame(1)
					if withhold {
						msg = msg[:len(msg)-1]
					}
					for i := range msg {
						n := perChunk
						if i >= 8 && perChunk > 1 {
							n = 1 // the kernel limits descriptors in flight
						}
						peer.mustSend(msg[i:i+1], n)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					got, err := r.recv(ctx, conn)
					assert.Nil(t, got)
					require.ErrorIs(t, err, cuda.ErrInvalidArgument, "refused, not timed out: %v", err)
					assert.NotErrorIs(t, err, context.DeadlineExceeded)
					assert.Equal(t, base, fdCount(t), "everything that arrived was closed")
				})
			}
		}
	}
}

// TestHostilePeerMoreThanAnnounced: more descriptors than the frame
// announced (on the frame's first bytes, as SendFDs puts them) are
// refused as soon as the header is read, before the payload, which the
// peer here never sends: the receive does not wait for it. On a
// packet socket the datagram is refused whole. Attaching more than the
// receiver has room for truncates the control data (MSG_CTRUNC): what
// the kernel installed is closed.
func TestHostilePeerMoreThanAnnounced(t *testing.T) {
	for name, r := range receivers {
		for tname, typ := range socketTypes {
			t.Run(name+"/"+tname, func(t *testing.T) {
				peer, conn := newHostilePeer(t, typ, MaxFDs+8)
				base := fdCount(t)
				msg := handleFrame(1)
				if typ == syscall.SOCK_STREAM {
					msg = msg[:frameHeader] // the payload never comes
				}
				peer.mustSend(msg, MaxFDs+8)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				got, err := r.recv(ctx, conn)
				assert.Nil(t, got)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument, "refused, not timed out: %v", err)
				assert.Contains(t, err.Error(), "truncated", "more than fit: MSG_CTRUNC")
				assert.Equal(t, base, fdCount(t), "everything that arrived was closed")

				// Within the room, but more than announced.
				peer2, conn2 := newHostilePeer(t, typ, r.bound)
				base = fdCount(t)
				peer2.mustSend(msg, r.bound)
				got, err = r.recv(ctx, conn2)
				assert.Nil(t, got)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument, "refused, not timed out: %v", err)
				assert.Equal(t, base, fdCount(t), "everything that arrived was closed")
			})
		}
	}
}

// TestHostilePeerStallsMidFrame: a peer that sends a frame's first bytes
// (with the descriptors the frame announces) and then stops keeps the
// receiver blocked, but holding no more than the frame announced (at most
// the receiver's bound); a deadline, a cancellation, closing the
// receiving connection or the peer's end unblocks it with every received
// descriptor closed.
func TestHostilePeerStallsMidFrame(t *testing.T) {
	unblockers := map[string]func(peer *hostilePeer, conn *net.UnixConn, cancel context.CancelFunc){
		"deadline":        nil, // the context's own
		"cancel":          func(_ *hostilePeer, _ *net.UnixConn, cancel context.CancelFunc) { cancel() },
		"receiver closed": func(_ *hostilePeer, conn *net.UnixConn, _ context.CancelFunc) { conn.Close() },
		"peer shut down":  func(peer *hostilePeer, _ *net.UnixConn, _ context.CancelFunc) { peer.conn.CloseWrite() },
	}
	for name, r := range receivers {
		for uname, unblock := range unblockers {
			for _, cut := range []string{"mid-header", "mid-payload"} {
				t.Run(name+"/"+uname+"/"+cut, func(t *testing.T) {
					nfds := 1
					if name == "ReceiveFDs" {
						nfds = MaxFDs
					}
					peer, conn := newHostilePeer(t, syscall.SOCK_STREAM, nfds)
					base := fdCount(t)
					msg := handleFrame(nfds)
					stop := frameHeader / 2
					if cut == "mid-payload" {
						stop = frameHeader + 10
					}
					peer.mustSend(msg[:1], nfds) // the descriptors, on the first byte
					peer.mustSend(msg[1:stop], 0)

					timeout := time.Minute
					if unblock == nil {
						timeout = 500 * time.Millisecond
					}
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					type result struct {
						got *received
						err error
					}
					done := make(chan result, 1)
					go func() {
						got, err := r.recv(ctx, conn)
						done <- result{got, err}
					}()
					waitConsumed(t, conn)
					held := fdCount(t) - base
					assert.LessOrEqual(t, held, nfds, "blocked, holding at most what the frame announced")
					assert.LessOrEqual(t, held, r.bound)
					select {
					case res := <-done:
						t.Fatalf("returned (%v, %v) on a partial frame", res.got, res.err)
					default:
					}
					if unblock != nil {
						unblock(peer, conn, cancel)
					}
					var res result
					select {
					case res = <-done:
					case <-time.After(30 * time.Second):
						t.Fatal("still blocked")
					}
					assert.Nil(t, res.got)
					require.Error(t, res.err)
					want := base
					switch uname {
					case "deadline":
						assert.ErrorIs(t, res.err, context.DeadlineExceeded)
					case "cancel":
						assert.ErrorIs(t, res.err, context.Canceled)
					case "receiver closed":
						assert.ErrorIs(t, res.err, net.ErrClosed)
						want-- // the receiving socket itself
					case "peer shut down":
						assert.ErrorIs(t, res.err, io.ErrUnexpectedEOF)
					}
					assert.Equal(t, want, fdCount(t), "everything that arrived was closed")
				})
			}
		}
	}
}

// TestHostilePeerNonPoolFDs: a well-formed handle frame whose descriptor
// is no pool (a pipe, a regular file, a socket, a FIFO) is refused by
// ReceiveHandle, and the descriptor closed.
func TestHostilePeerNonPoolFDs(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	kinds := map[string]func(t *testing.T) int{
		"pipe": func(t *testing.T) int { return pipeFDs(t, 1)[0] },
		"regular file": func(t *testing.T) int {
			fd, err := syscall.Open(file, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			require.NoError(t, err)
			return fd
		},
		"socket": func(t *testing.T) int {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			require.NoError(t, syscall.Close(fds[1]))
			return fds[0]
		},
		"FIFO": func(t *testing.T) int {
			fd, err := syscall.Open(fifo, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
			require.NoError(t, err)
			return fd
		},
	}
	for name, mk := range kinds {
		t.Run(name, func(t *testing.T) {
			fd := mk(t)
			defer syscall.Close(fd)
			a, b := socketPair(t)
			base := fdCount(t)
			require.NoError(t, syscall.Sendmsg(rawFD(t, a), handleFrame(1), syscall.UnixRights(fd), nil, 0))
			h, err := ReceiveHandle(context.Background(), b)
			assert.Nil(t, h)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "not a pool exported by the driver")
			assert.Equal(t, base, fdCount(t), "the descriptor was closed")
		})
	}
}

// TestHostilePeerFloods: a peer that sends frame after frame with every
// descriptor it may attach (as fast as the socket and the kernel's limit
// on descriptors in flight let it) never makes the receiver hold more than
// one call's bound at a time, and once the flood is over the count is back
// at its baseline. ReceiveHandle refuses each frame (one descriptor
// expected); ReceiveFDs accepts them, and the caller closes each batch.
func TestHostilePeerFloods(t *testing.T) {
	for name, r := range receivers {
		t.Run(name, func(t *testing.T) {
			peer, conn := newHostilePeer(t, syscall.SOCK_STREAM, MaxFDs)
			base := fdCount(t)
			var sent atomic.Int32
			go func() {
				defer peer.conn.CloseWrite()
				for range 300 {
					err := peer.send(frame(make([]byte, handleMsgSize), MaxFDs), MaxFDs)
					for err == syscall.EAGAIN { // the socket is full: wait for the receiver
						time.Sleep(100 * time.Microsecond)
						err = peer.send(frame(make([]byte, handleMsgSize), MaxFDs), MaxFDs)
					}
					if err != nil {
						return // the kernel's limit on descriptors in flight
					}
					sent.Add(1)
				}
			}()
			// Count while the receiver works.
			var peak atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
						if n := int64(len(ents) - 1); n > peak.Load() {
							peak.Store(n)
						}
					}
				}
			}()
			frames := 0
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				got, err := r.recv(ctx, conn)
				cancel()
				if err != nil && errors.Is(err, context.DeadlineExceeded) {
					t.Fatal("the flood stalled the receiver")
				}
				if err != nil && !errors.Is(err, cuda.ErrInvalidArgument) {
					break // the flood is over (EOF)
				}
				if got != nil {
					require.NoError(t, got.close())
				}
				frames++
				require.Less(t, frames, 100000, "the receiver ends")
			}
			close(stop)
			wg.Wait()
			assert.Positive(t, sent.Load(), "the peer flooded")
			// The sampler's own ReadDir holds one more.
			assert.LessOrEqual(t, peak.Load(), int64(base+r.bound+1), "never more than one call's bound")
			assert.Equal(t, base, fdCount(t), "back at the baseline")
		})
	}
}
