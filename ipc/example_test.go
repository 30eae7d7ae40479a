package ipc_test

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strings"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// Share a pool with a child process: the pool's fd goes through
// exec.Cmd.ExtraFiles (the child's fd 3), its UUID and key as a Token
// over the child's stdin, and one buffer as a descriptor (on the line
// after it). The token holds the pool's key, so it goes through a pipe and
// never through the environment, which the child's own children inherit
// and /proc/PID/environ shows. The child's side is
// ExampleNewHandle; examples/ipc-two-process is the whole
// program.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{IPC: true, MaxSize: 64 << 20})
	if err != nil {
		log.Fatal(err) // cuda.ErrNotSupported off Linux or without POSIX-fd IPC
	}
	defer pool.Close()

	buf, err := pool.Allocate(1<<20, s)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()
	if err := buf.Fill32(0x2a, s); err != nil {
		log.Fatal(err)
	}
	if err := s.Sync(); err != nil { // the child reads what is there
		log.Fatal(err)
	}

	h, err := ipc.ExportPool(pool)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	desc, err := ipc.ExportBuffer(buf)
	if err != nil {
		log.Fatal(err)
	}
	enc, err := desc.MarshalBinary()
	if err != nil {
		log.Fatal(err)
	}
	f, err := h.ExtraFile()
	if err != nil {
		log.Fatal(err)
	}
	child := exec.Command(os.Args[0], "child")
	child.ExtraFiles = []*os.File{f} // fd 3 in the child
	// The token and the descriptor on the child's stdin, a line each.
	child.Stdin = strings.NewReader(h.Token() + "\n" + hex.EncodeToString(enc) + "\n")
	child.Stdout, child.Stderr = os.Stdout, os.Stderr
	err = child.Start()
	f.Close() // the child has its own copy now
	if err != nil {
		log.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		log.Fatal(err)
	}
}

// The child's side of Example: take the pool's fd and read its token
// from stdin, import the pool, then the buffer, and read it.
func ExampleNewHandle() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	in := bufio.NewReader(os.Stdin)
	token, err := in.ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	h, err := ipc.NewHandle(3, strings.TrimSpace(token))
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	pool, err := ipc.ImportPool(dev, h) // importing one UUID twice maps it once
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	line, err := in.ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	enc, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		log.Fatal(err)
	}
	var desc ipc.Descriptor
	if err := desc.UnmarshalBinary(enc); err != nil {
		log.Fatal(err) // errors.Is(err, ipc.ErrBadDescriptor)
	}
	buf, err := pool.Import(desc, nil) // refused unless the pool's key sealed it
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close() // unmaps here; the owner frees the memory
	fmt.Println("imported", buf.Size(), "bytes")
}

// Send a pool to another process over a Unix socket: the fd by
// SCM_RIGHTS, its UUID and key in the same message.
func ExampleSendHandle() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	h, err := ipc.ExportPool(pool)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close() // the receiver has its own fd

	c, err := net.Dial("unix", "/run/myapp/gpu.sock")
	if err != nil {
		log.Fatal(err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	if err := ipc.SendHandle(conn, h); err != nil {
		log.Fatal(err)
	}
	// The receiver: h, err := ipc.ReceiveHandle(context.Background(), conn); ipc.ImportPool(dev, h).
}

// Whatever arrives from another process is checked before use: a
// descriptor that is not one is refused when decoded.
func ExampleDescriptor_UnmarshalBinary() {
	var d ipc.Descriptor
	err := d.UnmarshalBinary(make([]byte, ipc.DescriptorSize))
	fmt.Println(errors.Is(err, ipc.ErrBadDescriptor))
	err = d.UnmarshalBinary([]byte("too short"))
	fmt.Println(errors.Is(err, ipc.ErrBadDescriptor))
	// Output:
	// true
	// true
}
