// Command ipc-two-process shares GPU memory between two processes.
//
// The parent makes an IPC-enabled device pool, writes a known pattern into
// one of its buffers and starts itself again as a child. The pool's file
// descriptor goes to the child through exec.Cmd.ExtraFiles (its fd 3), the
// pool's UUID and key as a token over a pipe (the child's stdin), and the
// buffer as a descriptor (plain bytes, hex-encoded here, on the next line).
// The child imports the pool and the buffer, checks the pattern and writes
// its own, which the parent then checks. It prints OK when both sides saw
// the other's data.
//
// The token holds the pool's secret key, which lets whoever has it make
// descriptors the importer trusts: it goes through a pipe that only the
// child reads, never through the environment, which every process the
// child starts (and theirs) inherits and which /proc/PID/environ shows.
//
// It needs Linux and a device that can export pools as POSIX file
// descriptors; without a driver it says what was tried and exits 1. It
// takes no flags: -h prints its usage.
//
//	go run ./examples/ipc-two-process
package main

import (
	"bufio"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

const (
	words   = 1 << 20            // 4 MiB of uint32
	envRole = "IPC_EXAMPLE_ROLE" // not a secret: says which side to run
)

const usage = `usage: ipc-two-process

Shares GPU memory with a child process through an IPC pool; each side
writes a pattern and checks the other's. It takes no flags.
`

func main() {
	fs := flag.NewFlagSet("ipc-two-process", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the errors are printed below, once
	err := fs.Parse(os.Args[1:])
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("takes no arguments, got %q", fs.Args())
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(os.Stderr, usage)
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "ipc-two-process: %v\n%s", err, usage)
		os.Exit(2)
	}
	if os.Getenv(envRole) == "child" {
		err = child()
	} else {
		err = parent()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ipc-two-process:", err)
		os.Exit(1)
	}
}

// pattern is word i of what the parent (seed 1) and the child (seed 2)
// write.
func pattern(seed uint32) []uint32 {
	p := make([]uint32, words)
	for i := range p {
		p[i] = uint32(i)*2654435761 + seed
	}
	return p
}

// check reads b back and compares it with the pattern for seed.
func check(b *buffer.Buffer, seed uint32, s *cuda.Stream) error {
	got := make([]uint32, words)
	if err := buffer.CopyToHost(got, b, s); err != nil {
		return err
	}
	for i, want := range pattern(seed) {
		if got[i] != want {
			return fmt.Errorf("word %d is %#x, want %#x (seed %d)", i, got[i], want, seed)
		}
	}
	return nil
}

func parent() (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	pool, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{IPC: true, MaxSize: 64 << 20})
	if errors.Is(err, cuda.ErrNotSupported) {
		return fmt.Errorf("this system cannot share pools between processes: %w", err)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pool.Close()) }()

	buf, err := pool.Allocate(words*4, s)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, buf.Close()) }()
	if err := buffer.CopyFromHost(buf, pattern(1), s); err != nil {
		return err
	}
	if err := s.Sync(); err != nil { // the child must see the data
		return err
	}

	h, err := ipc.ExportPool(pool)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	desc, err := ipc.ExportBuffer(buf)
	if err != nil {
		return err
	}
	enc, err := desc.MarshalBinary()
	if err != nil {
		return err
	}
	f, err := h.ExtraFile()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return errors.Join(err, f.Close())
	}
	cmd := exec.Command(self)
	cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
	cmd.Env = append(os.Environ(), envRole+"=child")
	// The token and the descriptor, a line each, on the child's stdin.
	cmd.Stdin = strings.NewReader(h.Token() + "\n" + hex.EncodeToString(enc) + "\n")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Start()
	if cerr := f.Close(); err == nil { // the child holds its own copy
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("child: %w", err)
	}
	// The child synchronized before it exited: its writes are done.
	if err := check(buf, 2, s); err != nil {
		return fmt.Errorf("parent reading what the child wrote: %w", err)
	}
	fmt.Printf("OK: parent and child each read the other's %d MiB through one pool\n", words*4>>20)
	return nil
}

func child() (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	in := bufio.NewReader(os.Stdin)
	token, err := in.ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the pool's token from stdin: %w", err)
	}
	h, err := ipc.NewHandle(3, strings.TrimSpace(token))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	pool, err := ipc.ImportPool(dev, h)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pool.Close()) }()

	line, err := in.ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the buffer's descriptor from stdin: %w", err)
	}
	enc, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		return err
	}
	var desc ipc.Descriptor
	if err := desc.UnmarshalBinary(enc); err != nil {
		return err
	}
	buf, err := pool.Import(desc, s)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, buf.Close()) }()
	if err := check(buf, 1, s); err != nil {
		return fmt.Errorf("child reading what the parent wrote: %w", err)
	}
	if err := buffer.CopyFromHost(buf, pattern(2), s); err != nil {
		return err
	}
	if err := s.Sync(); err != nil {
		return err
	}
	fmt.Println("child: read the parent's data and wrote its own")
	return nil
}
