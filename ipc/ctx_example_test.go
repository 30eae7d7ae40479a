//go:build linux

package ipc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/cudamem/cudamem/ipc"
)

// Wait for a peer's handle with a deadline: when the peer sends nothing,
// the receive ends with the context, and the connection stays usable.
func ExampleReceiveHandle() {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
	if err != nil {
		log.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			log.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	ours, theirs := conn(fds[0]), conn(fds[1])
	defer ours.Close()
	defer theirs.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = ipc.ReceiveHandle(ctx, ours)
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output: true
}
