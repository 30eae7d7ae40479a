//go:build unix

package ipc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
)

// MaxFDs is the most file descriptors one message carries.
const MaxFDs = 64

// Every message is framed: a header of frameMagic, the payload length and
// the number of descriptors attached, then the payload. On a stream socket
// the receiver reads exactly the header and then exactly the payload; on
// others the frame is one datagram and is checked against it.
const (
	frameHeader = 4 + 4 + 4
	// maxFramePayload bounds what a peer can make the receiver expect.
	maxFramePayload = 1 << 30
)

var frameMagic = [4]byte{'c', 'm', 'F', '1'}

func socketType(conn *net.UnixConn) (int, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var typ int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		typ, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TYPE)
	}); err != nil {
		return 0, err
	}
	return typ, serr
}

// checkSend checks what SendFDs and SendPlain are given.
func checkSend(op string, conn *net.UnixConn, fds []int) error {
	if conn == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil connection")
	}
	if len(fds) > MaxFDs {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%d file descriptors, at most %d per message", len(fds), MaxFDs)
	}
	for i, fd := range fds {
		if fd < 0 {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "file descriptor %d of %d is %d", i, len(fds), fd)
		}
	}
	return nil
}

// closeReceived closes the descriptors that arrived with a refused
// message, adding a failure to close them to err.
func closeReceived(err error, fds []int) error {
	if cerr := osfd.CloseAll(fds); cerr != nil {
		return errors.Join(err, fmt.Errorf("closing the %d received descriptors: %w", len(fds), cerr))
	}
	return err
}

// SendFDs sends payload and the file descriptors over a Unix socket
// (SCM_RIGHTS) as one framed message; ReceiveFDs reads it on any socket
// type (stream, seqpacket or datagram). The receiver gets duplicates; the
// caller still owns (and should close) its own fds.
func SendFDs(conn *net.UnixConn, payload []byte, fds ...int) error {
	const op = "ipc.SendFDs"
	if err := checkSend(op, conn, fds); err != nil {
		return err
	}
	if len(payload) > maxFramePayload {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "payload of %d bytes, at most %d per message", len(payload), maxFramePayload)
	}
	typ, err := socketType(conn)
	if err != nil {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("socket type: %w", err)}
	}
	msg := make([]byte, frameHeader+len(payload))
	copy(msg, frameMagic[:])
	binary.LittleEndian.PutUint32(msg[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(msg[8:], uint32(len(fds)))
	copy(msg[frameHeader:], payload)
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	n, oobn, err := conn.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	if oobn != len(oob) {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("short write: %d of %d control bytes", oobn, len(oob))}
	}
	if n < len(msg) {
		if typ != syscall.SOCK_STREAM {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("short write: %d of %d bytes", n, len(msg))}
		}
		// A stream may take a long message in pieces; the descriptors
		// went with the first.
		if _, err := conn.Write(msg[n:]); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("after %d of %d bytes: %w", n, len(msg), err)}
		}
	}
	return nil
}

// recvmsg is one recvmsg call on conn, waiting for data as the net
// package does. The socket is refused before anything is read when the
// kernel would attach control messages of its own (checkRecvOpts,
// peekOwnControl): they would take the descriptors' room, losing the
// message.
func recvmsg(conn *net.UnixConn, buf, oob []byte) (n, oobn, flags int, err error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, 0, err
	}
	var rerr error
	if !skipRecvChecks {
		if err := rc.Control(func(fd uintptr) { rerr = checkRecvOpts(int(fd)) }); err != nil {
			return 0, 0, 0, err
		}
		if rerr != nil {
			return 0, 0, 0, rerr
		}
	}
	err = rc.Read(func(fd uintptr) bool {
		if !skipRecvChecks {
			if rerr = peekOwnControl(int(fd)); rerr != nil {
				return true
			}
		}
		for {
			n, oobn, flags, _, rerr = syscall.Recvmsg(int(fd), buf, oob, recvFlags)
			if rerr != syscall.EINTR {
				break
			}
		}
		return rerr != syscall.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	return n, oobn, flags, err
}

// skipRecvChecks turns off recvmsg's checks before the read, for tests of
// an option set between the checks and the read.
var skipRecvChecks bool

// rights appends the descriptors in the control bytes oob to fds, also
// when it returns an error, so that the caller closes them all (those of
// a refused control message too: the sender's pidfd, on Linux). A control
// message other than SCM_RIGHTS is refused; a truncated one still gives
// up the whole descriptors it holds; a header too short to be one ends
// the walk, with an error.
func rights(oob []byte, fds []int) ([]int, error) {
	var err error
	data := syscall.CmsgLen(0) // where a message's data starts
	for len(oob) >= syscall.SizeofCmsghdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		size := uint64(h.Len)
		if size < uint64(syscall.SizeofCmsghdr) {
			return fds, errors.Join(err, fmt.Errorf("%w: control message of %d bytes, shorter than its header", cuda.ErrInvalidArgument, size))
		}
		end := len(oob)
		if size < uint64(end) {
			end = int(size)
		}
		if controlFDs(h.Level, h.Type) {
			for i := data; i+4 <= end; i += 4 {
				if fd := int(int32(binary.NativeEndian.Uint32(oob[i:]))); fd >= 0 {
					fds = append(fds, fd)
				}
			}
		}
		if (h.Level != syscall.SOL_SOCKET || h.Type != syscall.SCM_RIGHTS) && err == nil {
			err = errControlMessage(h.Level, h.Type)
		}
		if size >= uint64(len(oob)) {
			break
		}
		next := syscall.CmsgSpace(int(size)) - syscall.CmsgSpace(0) // size, aligned
		if next >= len(oob) {
			break
		}
		oob = oob[next:]
	}
	return fds, err
}

// ReceiveFDs receives one message sent with SendFDs: its payload (up to
// maxPayload bytes) and the file descriptors it carried, which the caller
// now owns (close-on-exec set). Anything else is refused and every
// descriptor that arrived with it is closed: a payload over maxPayload, a
// message that is not a SendFDs frame, truncated control data (more than
// MaxFDs descriptors), or a count of descriptors that differs from the
// frame's. After an error on a stream socket the connection's position in
// the byte stream is unknown: close it.
//
// A receiving socket that makes the kernel attach control messages of its
// own is refused (ErrInvalidArgument, naming the option) before anything
// is read, and the message stays on the socket: those messages would take
// the descriptors' room, and the message would be lost. On Linux that is
// SO_PASSCRED, SO_PASSPIDFD, SO_PASSSEC, the receive timestamp options
// (old and _NEW), SO_INQ, SO_RXQ_OVFL, SO_WIFI_STATUS, SO_RCVMARK and
// SO_RCVPRIORITY, and anything a look at the next message (taking
// nothing) finds. Such a message that arrives anyway (the option set
// during the receive) is refused, and its descriptors are closed.
//
// The peer is not trusted: on a stream socket descriptors are taken from
// the frame's first read only and checked as soon as the header is in,
// so one call never holds more than MaxFDs of them, even while a peer
// that stopped mid-frame keeps it waiting.
//
// ReceiveFDs gives up when ctx is done, with an error naming the operation
// that wraps ctx's error (context.Canceled or context.DeadlineExceeded). It
// works through conn's read deadline (no goroutine waits for the message):
// a ctx that can end replaces that deadline for the call and clears it on
// return, while context.Background() leaves a deadline set on conn in
// force.
func ReceiveFDs(ctx context.Context, conn *net.UnixConn, maxPayload int) (payload []byte, fds []int, err error) {
	const op = "ipc.ReceiveFDs"
	err = withReadContext(ctx, op, conn, func() error {
		payload, fds, err = receiveFDs(op, conn, maxPayload, MaxFDs)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return payload, fds, nil
}

// receiveFDs is ReceiveFDs for messages of at most maxFDs descriptors:
// control space is made for that many only, so the kernel drops any more
// (MSG_CTRUNC) rather than installing them here.
func receiveFDs(op string, conn *net.UnixConn, maxPayload, maxFDs int) (payload []byte, fds []int, err error) {
	if conn == nil {
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil connection")
	}
	if maxPayload < 0 || maxPayload > maxFramePayload {
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "maxPayload %d, want 0 to %d", maxPayload, maxFramePayload)
	}
	typ, err := socketType(conn)
	if err != nil {
		return nil, nil, &cuda.OpError{Op: op, Err: fmt.Errorf("socket type: %w", err)}
	}
	if typ == syscall.SOCK_STREAM {
		payload, fds, err = receiveStream(conn, maxPayload, maxFDs)
	} else {
		payload, fds, err = receivePacket(conn, maxPayload, maxFDs)
	}
	if err == nil {
		err = setCloexec(fds)
	}
	if err != nil {
		return nil, nil, &cuda.OpError{Op: op, Err: closeReceived(err, fds)}
	}
	return payload, fds, nil
}

// errBadFrame marks messages that are not what SendFDs sends.
var errBadFrame = fmt.Errorf("malformed message (%w)", cuda.ErrInvalidArgument)

func checkHeader(h []byte, maxPayload, maxFDs int) (n, nfds int, err error) {
	if [4]byte(h[:4]) != frameMagic {
		return 0, 0, fmt.Errorf("%w: no ipc.SendFDs frame header (% x)", errBadFrame, h[:4])
	}
	n64, nf := binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[8:])
	if uint64(n64) > uint64(maxPayload) {
		return 0, 0, fmt.Errorf("%w: payload of %d bytes, at most %d expected", errBadFrame, n64, maxPayload)
	}
	if uint64(nf) > uint64(maxFDs) {
		return 0, 0, fmt.Errorf("%w: %d file descriptors announced, at most %d expected", errBadFrame, nf, maxFDs)
	}
	return int(n64), int(nf), nil
}

func checkTrunc(flags, maxFDs int) error {
	if flags&syscall.MSG_CTRUNC != 0 {
		return fmt.Errorf("%w: control data truncated (more than %d file descriptors, or a control message of the kernel's own that did not fit; the kernel closed the descriptors it had no room for)", errBadFrame, maxFDs)
	}
	return nil
}

// receiveStream reads exactly one frame from a stream socket, never a byte
// of the next one. Descriptors are taken from the frame's first read only
// (where SendFDs puts them), and checked against the header as soon as it
// is complete.
func receiveStream(conn *net.UnixConn, maxPayload, maxFDs int) ([]byte, []int, error) {
	oob := make([]byte, syscall.CmsgSpace(maxFDs*4))
	var fds []int
	reads := 0 // reads of this frame that returned bytes
	read := func(buf []byte) error {
		for got := 0; got < len(buf); {
			n, oobn, flags, err := recvmsg(conn, buf[got:], oob)
			had := len(fds)
			var rerr error
			fds, rerr = rights(oob[:oobn], fds)
			if err != nil {
				return err
			}
			if rerr != nil {
				return rerr
			}
			if err := checkTrunc(flags, maxFDs); err != nil {
				return err
			}
			if len(fds) > had && reads > 0 {
				return fmt.Errorf("%w: %d file descriptors arrived after the first %d bytes of the frame (a sender attaches them to its first bytes)", errBadFrame, len(fds)-had, reads)
			}
			if len(fds) > maxFDs { // the kernel may round control space up
				return fmt.Errorf("%w: %d file descriptors in one read, at most %d expected", errBadFrame, len(fds), maxFDs)
			}
			if n == 0 {
				if got == 0 && reads == 0 && len(fds) == 0 {
					return io.EOF
				}
				return io.ErrUnexpectedEOF
			}
			reads++
			got += n
		}
		return nil
	}
	var h [frameHeader]byte
	if err := read(h[:]); err != nil {
		return nil, fds, err
	}
	n, nfds, err := checkHeader(h[:], maxPayload, maxFDs)
	if err != nil {
		return nil, fds, err
	}
	// Every descriptor has arrived: compare before waiting for the payload.
	if len(fds) != nfds {
		return nil, fds, fmt.Errorf("%w: %d file descriptors received, the frame announced %d", errBadFrame, len(fds), nfds)
	}
	payload := make([]byte, n)
	if err := read(payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fds, err
	}
	return payload, fds, nil
}

// receivePacket reads one datagram (SOCK_SEQPACKET or SOCK_DGRAM) holding
// one frame.
func receivePacket(conn *net.UnixConn, maxPayload, maxFDs int) ([]byte, []int, error) {
	oob := make([]byte, syscall.CmsgSpace(maxFDs*4))
	buf := make([]byte, frameHeader+maxPayload)
	n, oobn, flags, err := recvmsg(conn, buf, oob)
	fds, rerr := rights(oob[:oobn], nil)
	switch {
	case err != nil:
		return nil, fds, err
	case rerr != nil:
		return nil, fds, rerr
	}
	if err := checkTrunc(flags, maxFDs); err != nil {
		return nil, fds, err
	}
	if flags&syscall.MSG_TRUNC != 0 {
		return nil, fds, fmt.Errorf("%w: payload of more than %d bytes", errBadFrame, maxPayload)
	}
	if n == 0 && len(fds) == 0 && oobn == 0 {
		return nil, fds, io.EOF
	}
	if n < frameHeader {
		return nil, fds, fmt.Errorf("%w: %d bytes, shorter than a frame header", errBadFrame, n)
	}
	size, nfds, err := checkHeader(buf[:frameHeader], maxPayload, maxFDs)
	if err != nil {
		return nil, fds, err
	}
	if size != n-frameHeader {
		return nil, fds, fmt.Errorf("%w: %d payload bytes received, the frame announced %d", errBadFrame, n-frameHeader, size)
	}
	if len(fds) != nfds {
		return nil, fds, fmt.Errorf("%w: %d file descriptors received, the frame announced %d", errBadFrame, len(fds), nfds)
	}
	return buf[frameHeader:n:n], fds, nil
}

// A handle message's payload: handleMagic (8), version (2), flags (2: bit
// 0 set when a key follows), the pool's UUID (16) and its key (32; zeros
// without one). Version 1 (no key) is refused.
const (
	handleVersion     = 2
	handleMsgSize     = 8 + 2 + 2 + 16 + keySize
	handleFlagKeyed   = 1
	handleUUIDOffset  = 12
	handleKeyOffset   = handleUUIDOffset + 16
	handleFlagsOffset = 10
)

var handleMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'H'}

func encodeHandle(u UUID, k poolKey) []byte {
	b := make([]byte, handleMsgSize)
	copy(b, handleMagic[:])
	binary.LittleEndian.PutUint16(b[8:], handleVersion)
	if k.has() {
		binary.LittleEndian.PutUint16(b[handleFlagsOffset:], handleFlagKeyed)
		copy(b[handleKeyOffset:], *k.k)
	}
	copy(b[handleUUIDOffset:], u[:])
	return b
}

func decodeHandle(b []byte) (UUID, poolKey, error) {
	switch {
	case len(b) != handleMsgSize:
		return UUID{}, poolKey{}, fmt.Errorf("%w: handle message of %d bytes, want %d (a UUID-only message is from a cudamem without pool keys)", errBadFrame, len(b), handleMsgSize)
	case [8]byte(b[:8]) != handleMagic:
		return UUID{}, poolKey{}, fmt.Errorf("%w: not a handle message (magic %q)", errBadFrame, b[:8])
	case binary.LittleEndian.Uint16(b[8:]) != handleVersion:
		return UUID{}, poolKey{}, fmt.Errorf("%w: handle message version %d, this library reads %d", errBadFrame, binary.LittleEndian.Uint16(b[8:]), handleVersion)
	}
	flags := binary.LittleEndian.Uint16(b[handleFlagsOffset:])
	if flags&^handleFlagKeyed != 0 {
		return UUID{}, poolKey{}, fmt.Errorf("%w: unknown handle message flags %#x", errBadFrame, flags)
	}
	var u UUID
	copy(u[:], b[handleUUIDOffset:])
	if u == (UUID{}) {
		return UUID{}, poolKey{}, fmt.Errorf("%w: handle message with the zero UUID (no pool is named by it)", errBadFrame)
	}
	var k poolKey
	if flags&handleFlagKeyed != 0 {
		k = keyFrom(b[handleKeyOffset:])
	} else if [keySize]byte(b[handleKeyOffset:]) != ([keySize]byte{}) {
		return UUID{}, poolKey{}, fmt.Errorf("%w: key bytes in a handle message without a key", errBadFrame)
	}
	return u, k, nil
}

// SendHandle sends an exported pool's fd, UUID and pool key over a Unix
// socket. h stays open on this side (and cannot be closed during the
// send). The key is the pool's secret: send handles only to processes you
// would let make descriptors for the pool.
func SendHandle(conn *net.UnixConn, h *Handle) error {
	return h.use("ipc.SendHandle", func(fd int) error {
		return SendFDs(conn, encodeHandle(h.uuid, h.key), fd)
	})
}

// ReceiveHandle receives a Handle sent with SendHandle, key included; the
// caller owns it. A message with other than one fd and a handle payload of
// this version is refused, and whatever descriptors it carried are closed;
// so is one whose fd is of a kind no pool export is (see ImportPool).
// However many descriptors the peer attaches, one call installs at most
// two (the kernel closes the rest). It gives up when ctx is done, as
// ReceiveFDs does.
func ReceiveHandle(ctx context.Context, conn *net.UnixConn) (h *Handle, err error) {
	const op = "ipc.ReceiveHandle"
	err = withReadContext(ctx, op, conn, func() error {
		h, err = receiveHandle(op, conn)
		return err
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// receiveHandle is ReceiveHandle without the context.
func receiveHandle(op string, conn *net.UnixConn) (*Handle, error) {
	payload, fds, err := receiveFDs(op, conn, handleMsgSize, 1)
	if err != nil {
		return nil, err
	}
	u, k, err := decodeHandle(payload)
	var h *Handle
	switch {
	case err != nil:
		err = &cuda.OpError{Op: op, Err: err}
	case len(fds) != 1:
		err = cuda.Errorf(op, cuda.ErrInvalidArgument, "got %d fds, want 1", len(fds))
	default:
		// The peer chose the descriptor: one that cannot be a pool is
		// closed here, and never becomes a Handle.
		if err = checkPoolFD(op, fds[0]); err == nil {
			h, err = newHandle(op, fds[0], u, k)
		}
	}
	if err != nil {
		return nil, closeReceived(err, fds)
	}
	return h, nil
}
