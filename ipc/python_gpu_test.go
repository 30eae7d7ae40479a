//go:build linux

package ipc_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// Interop with Python: cuda.core's pools and PyTorch's shared tensors, in
// both directions, data checked on each side. The tests need a GPU (they
// skip without one, and fail with CUDAMEM_REQUIRE_GPU=1 as the others do)
// and python3 with cuda.core (and torch, for the torch tests); without
// those they skip, CUDAMEM_REQUIRE_GPU or not. The scripts are in
// testdata; they exit 77 to ask for a skip.

const (
	pySize     = 1 << 20
	pyTimeout  = 30 * time.Second
	pySkipCode = 77
)

// pyModules is what testdata/probe.py found.
type pyModules struct {
	Python   string `json:"python"`
	CudaCore string `json:"cuda_core"`
	Torch    string `json:"torch"`
	CoreErr  string `json:"cuda_core_error"`
	TorchErr string `json:"torch_error"`
}

// python returns the python3 path and its modules, skipping without
// python3.
func python(t *testing.T) (string, pyModules) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skipf("no python3: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pyTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "testdata/probe.py").Output()
	if err != nil {
		t.Skipf("python3 testdata/probe.py: %v", err)
	}
	var m pyModules
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(out), &m), "probe said %s", out)
	t.Logf("python %s, cuda.core %q, torch %q", m.Python, m.CudaCore, m.Torch)
	return py, m
}

func needCore(t *testing.T, m pyModules) {
	t.Helper()
	if m.CudaCore == "" {
		t.Skipf("python3 has no cuda.core: %s", m.CoreErr)
	}
}

func needTorch(t *testing.T, m pyModules) {
	t.Helper()
	if m.Torch == "" {
		t.Skipf("python3 has no usable torch: %s", m.TorchErr)
	}
}

// pyCmd prepares a script run with a timeout; the test ends it.
func pyCmd(t *testing.T, py, script string, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pyTimeout)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, py, append([]string{"testdata/" + script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	return cmd
}

// pyResult fails the test unless the script succeeded, and skips when it
// asked to (status 77).
func pyResult(t *testing.T, script string, err error, out []byte) {
	t.Helper()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == pySkipCode {
		t.Skipf("%s: %s", script, bytes.TrimSpace(out))
	}
	require.NoError(t, err, "%s:\n%s", script, out)
	require.Contains(t, string(out), "OK", "%s:\n%s", script, out)
	t.Logf("%s: %s", script, bytes.TrimSpace(out))
}

func fillHost(t *testing.T, b *buffer.Buffer, s *cuda.Stream, seed uint32) {
	t.Helper()
	require.NoError(t, buffer.CopyFromHost(b, cudatest.Pattern(int(b.Size()), seed), s))
	require.NoError(t, s.Sync())
}

func requirePattern(t *testing.T, b *buffer.Buffer, s *cuda.Stream, seed uint32, what string) {
	t.Helper()
	got := make([]byte, b.Size())
	require.NoError(t, buffer.CopyToHost(got, b, s))
	require.NoError(t, s.Sync())
	want := cudatest.Pattern(len(got), seed)
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: byte %d of %d is %#x, want %#x (seed %d)", what, i, len(got), got[i], want[i], seed)
	}
}

// Go exports a pool and a buffer; cuda.core imports them from the raw
// parts (fd, UUID, Descriptor.ExportData and size), checks Go's data and
// writes its own, which Go checks. With torch, PyTorch does the reading
// and writing on the imported memory.
func TestPythonImportsGoPool(t *testing.T) {
	d := cudatest.Device(t)
	py, mods := python(t)
	needCore(t, mods)
	for _, withTorch := range []bool{false, true} {
		t.Run(fmt.Sprintf("torch=%v", withTorch), func(t *testing.T) {
			if withTorch {
				needTorch(t, mods)
			}
			s := cudatest.Stream(t, d)
			pool := ipcPool(t, d)
			b, err := pool.Allocate(pySize, s)
			require.NoError(t, err)
			defer func() { assert.NoError(t, b.Close()) }()
			fillHost(t, b, s, 11)
			h, err := ipc.ExportPool(pool)
			require.NoError(t, err)
			defer h.Close()
			desc, err := ipc.ExportBuffer(b)
			require.NoError(t, err)
			f, err := h.ExtraFile()
			require.NoError(t, err)
			args := []string{"--fd", "3", "--uuid", h.UUID().String(), "--data", hex.EncodeToString(desc.ExportData()),
				"--size", strconv.FormatUint(desc.Size, 10), "--seed", "11", "--newseed", "12", "--device", strconv.Itoa(d.Ordinal())}
			if withTorch {
				args = append(args, "--torch")
			}
			cmd := pyCmd(t, py, "cudacore_import.py", args...)
			cmd.ExtraFiles = []*os.File{f}
			out, err := cmd.CombinedOutput()
			f.Close()
			pyResult(t, "cudacore_import.py", err, out)
			requirePattern(t, b, s, 12, "Python's writes seen from Go")
		})
	}
}

// Go -> Python over a plain Unix socket, no ExtraFiles and no framing:
// the pool's fd and, in the same message, its UUID and a buffer's export
// data and size (one JSON line), sent with ipc.SendPlain as Python's
// socket.recv_fds reads them. cuda.core imports pool and buffer
// (from_allocation_handle, IPCBufferDescriptor._init,
// Buffer.from_ipc_descriptor), checks Go's data and writes its own, which
// Go checks. The reverse direction is TestPythonExportsToGo.
func TestPythonImportsGoPoolOverSocket(t *testing.T) {
	d := cudatest.Device(t)
	py, mods := python(t)
	needCore(t, mods)
	s := cudatest.Stream(t, d)
	pool := ipcPool(t, d)
	b, err := pool.Allocate(pySize, s)
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	fillHost(t, b, s, 51)
	h, err := ipc.ExportPool(pool)
	require.NoError(t, err)
	defer h.Close()
	desc, err := ipc.ExportBuffer(b)
	require.NoError(t, err)
	poolFD, err := h.FD()
	require.NoError(t, err)

	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	theirs := os.NewFile(uintptr(pair[1]), "python-socket")
	defer theirs.Close()
	ours := os.NewFile(uintptr(pair[0]), "go-socket")
	c, err := net.FileConn(ours)
	ours.Close()
	require.NoError(t, err)
	conn := c.(*net.UnixConn)
	defer conn.Close()
	msg, err := json.Marshal(pyPoolMsg{UUID: h.UUID().String(), Data: hex.EncodeToString(desc.ExportData()), Size: desc.Size})
	require.NoError(t, err)
	// Sent before Python starts: the socket holds the message and a
	// reference to the fd until Python's recv_fds.
	require.NoError(t, ipc.SendPlain(conn, append(msg, '\n'), poolFD))
	t.Logf("sent with ipc.SendPlain: pool fd %d (UUID %v) and %d bytes: %s", poolFD, h.UUID(), len(msg)+1, msg)

	cmd := pyCmd(t, py, "cudacore_import.py", "--sock", "3", "--seed", "51", "--newseed", "52", "--device", strconv.Itoa(d.Ordinal()))
	cmd.ExtraFiles = []*os.File{theirs}
	out, err := cmd.CombinedOutput()
	pyResult(t, "cudacore_import.py", err, out)
	require.Contains(t, string(out), "received over the socket", "%s", out)
	requirePattern(t, b, s, 52, "Python's writes seen from Go")
	t.Logf("Go's pattern (seed 51) read by cuda.core, cuda.core's (seed 52) read by Go: ok")
}

// pyPoolMsg is what cudacore_export.py sends with the pool's fd.
type pyPoolMsg struct {
	UUID string `json:"uuid"`
	Data string `json:"data"`
	Size uint64 `json:"size"`
}

// receivePool reads cudacore_export.py's message and the fd with it
// (socket.send_fds on the Python side, ipc.ReceivePlain here); ok is false
// when Python closed the socket without sending (it failed or asked for
// a skip: its exit status says which).
func receivePool(t *testing.T, sock int) (msg pyPoolMsg, fd int, ok bool) {
	t.Helper()
	dup, err := syscall.Dup(sock) // sock stays the caller's, for the reply
	require.NoError(t, err)
	f := os.NewFile(uintptr(dup), "python-socket")
	c, err := net.FileConn(f)
	f.Close()
	require.NoError(t, err)
	defer c.Close()
	conn := c.(*net.UnixConn)
	line, fds, err := ipc.ReceivePlain(context.Background(), conn, 4096, 4)
	if errors.Is(err, io.EOF) {
		return pyPoolMsg{}, -1, false
	}
	require.NoError(t, err)
	require.Len(t, fds, 1, "one fd with the message")
	buf := make([]byte, 4096)
	for !bytes.HasSuffix(line, []byte("\n")) { // the rest of a split message
		m, err := conn.Read(buf)
		require.NoError(t, err)
		line = append(line, buf[:m]...)
	}
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(line), &msg), "%s", line)
	return msg, fds[0], true
}

// cuda.core exports a pool and a buffer; Go imports them (ImportPool of
// NewHandle(fd, uuid), or of NewForeignHandle(fd) for a bare fd, then
// ImportUnauthenticated), checks Python's data and writes its own, which Python
// checks.
func TestPythonExportsToGo(t *testing.T) {
	d := cudatest.Device(t)
	py, mods := python(t)
	needCore(t, mods)
	feat, err := d.Features()
	require.NoError(t, err)
	if !feat.PoolIPC {
		t.Skip("device cannot export pools as POSIX fds")
	}
	for _, bare := range []bool{false, true} {
		t.Run(fmt.Sprintf("bareFD=%v", bare), func(t *testing.T) {
			pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			defer syscall.Close(pair[0])
			child := os.NewFile(uintptr(pair[1]), "python-socket")
			args := []string{"--sock", "3", "--size", strconv.Itoa(pySize), "--seed", "21", "--newseed", "22", "--device", strconv.Itoa(d.Ordinal())}
			if bare {
				args = append(args, "--no-uuid")
			}
			cmd := pyCmd(t, py, "cudacore_export.py", args...)
			cmd.ExtraFiles = []*os.File{child}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			child.Close()
			waited := false
			defer func() {
				if !waited {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			}()
			msg, fd, ok := receivePool(t, pair[0])
			if !ok {
				err := cmd.Wait()
				waited = true
				pyResult(t, "cudacore_export.py", err, out.Bytes()) // skips on 77
				t.Fatalf("cudacore_export.py sent nothing:\n%s", out.Bytes())
			}
			data, err := hex.DecodeString(msg.Data)
			require.NoError(t, err)

			var h *ipc.Handle
			if bare {
				var derived bool
				h, derived, err = ipc.NewForeignHandle(fd)
				require.NoError(t, err)
				t.Logf("bare fd: UUID derived from the fd's file: %v (%v)", derived, h.UUID())
			} else {
				h, err = ipc.NewHandle(fd, msg.UUID)
				require.NoError(t, err, "cuda.core's UUID")
			}
			defer h.Close()
			pool, err := ipc.ImportPool(d, h)
			require.NoError(t, err)
			s := cudatest.Stream(t, d)
			b, err := pool.ImportUnauthenticated(data, msg.Size, s)
			require.NoError(t, err)
			requirePattern(t, b, s, 21, "Python's data seen from Go")
			fillHost(t, b, s, 22)
			require.NoError(t, b.Close())
			require.NoError(t, pool.Close())

			_, err = syscall.Write(pair[0], []byte("done\n"))
			require.NoError(t, err)
			err = cmd.Wait()
			waited = true
			pyResult(t, "cudacore_export.py", err, out.Bytes())
		})
	}
}

// PyTorch shares a tensor as torch.multiprocessing does; Go maps it with
// OpenLegacy (having waited for the producer's event), checks it and
// writes it, and closes it; the tensor in Python shows Go's data. The
// close released the share as torch's own consumer does: its counter is
// 0, the producer's memory is back to where it started once it drops the
// tensor, and it does not warn at exit that shared tensors were not
// released (before, Go released nothing: the memory stayed allocated
// until the producer exited, which then warned).
func TestPythonTorchSharesWithGo(t *testing.T) {
	d := cudatest.Device(t)
	py, mods := python(t)
	needTorch(t, mods)
	cmd := pyCmd(t, py, "torch_share.py", "--size", strconv.Itoa(pySize), "--seed", "31", "--newseed", "32", "--device", strconv.Itoa(d.Ordinal()))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	waited := false
	defer func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "{") {
		rest, _ := io.ReadAll(rd)
		werr := cmd.Wait()
		waited = true
		pyResult(t, "torch_share.py", werr, []byte(line+string(rest)+stderr.String()))
		t.Fatalf("torch_share.py sent no handle: %q %v", line, err)
	}
	var msg struct {
		Handle     string `json:"handle"`
		Offset     uint64 `json:"offset"`
		Size       uint64 `json:"size"`
		RefCounter string `json:"ref_counter"`
		RefOffset  uint64 `json:"ref_counter_offset"`
		Event      string `json:"event"`
		EventSync  bool   `json:"event_sync"`
	}
	require.NoError(t, json.Unmarshal([]byte(line), &msg))
	raw, err := hex.DecodeString(msg.Handle)
	require.NoError(t, err)
	ev, err := hex.DecodeString(msg.Event)
	require.NoError(t, err)
	th, err := ipc.NewTorchShare(raw, msg.Offset, msg.Size, []byte(msg.RefCounter), msg.RefOffset, ev, msg.EventSync)
	require.NoError(t, err)
	t.Logf("torch storage: %d bytes at offset %d of its segment; counter %d of %s; event to wait for: %v",
		msg.Size, msg.Offset, msg.RefOffset, msg.RefCounter, msg.EventSync)
	require.Equal(t, uint64(pySize), th.Size)

	b, err := ipc.OpenLegacy(d, th)
	require.NoError(t, err)
	s := cudatest.Stream(t, d)
	requirePattern(t, b, s, 31, "the tensor seen from Go")
	fillHost(t, b, s, 32)

	// An open share is released by its Buffer's Close, not ReleaseTorch.
	assert.ErrorIs(t, ipc.ReleaseTorch(th), cuda.ErrInvalidArgument)
	require.NoError(t, b.Close())
	// Released once: a second release finds nothing to release.
	assert.ErrorIs(t, ipc.ReleaseTorch(th), cuda.ErrInvalidArgument)

	// A handle claiming more than the segment holds is refused (without
	// the share's counter, released already, and the event, waited for).
	big := th
	big.Size = 1 << 40
	big.RefCounter, big.EventSync = "", false
	_, err = ipc.OpenLegacy(d, big)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)

	_, err = stdin.Write([]byte("done\n"))
	require.NoError(t, err)
	rest, _ := io.ReadAll(rd)
	err = cmd.Wait()
	waited = true
	pyResult(t, "torch_share.py", err, append(rest, stderr.Bytes()...))
	assert.NotContains(t, stderr.String(), "Producer process has been terminated before all shared CUDA tensors released",
		"torch's producer warned at exit that a share was not released")
}

// Go shares cuMemAlloc memory (a view inside an allocation) with
// ExportLegacy; PyTorch maps it, checks and overwrites it; Go sees the
// writes, and nothing outside the view changed.
func TestPythonTorchImportsGo(t *testing.T) {
	d := cudatest.Device(t)
	py, mods := python(t)
	needTorch(t, mods)
	mr, err := resource.NewSyncDevice(d)
	require.NoError(t, err)
	s := cudatest.Stream(t, d)
	whole, err := mr.Allocate(2*pySize, s)
	require.NoError(t, err)
	defer func() { assert.NoError(t, whole.Close()) }()
	fillHost(t, whole, s, 40)
	const off = 4096
	view, err := whole.Slice(off, pySize)
	require.NoError(t, err)
	fillHost(t, view, s, 41)
	th, err := ipc.ExportLegacy(view)
	require.NoError(t, err)
	assert.Equal(t, uint64(off), th.Offset)
	assert.Equal(t, uint64(pySize), th.Size)

	cmd := pyCmd(t, py, "torch_import.py", "--handle", hex.EncodeToString(th.Handle.Reserved[:]),
		"--offset", strconv.FormatUint(th.Offset, 10), "--size", strconv.FormatUint(th.Size, 10),
		"--seed", "41", "--newseed", "42", "--device", strconv.Itoa(d.Ordinal()))
	out, err := cmd.CombinedOutput()
	pyResult(t, "torch_import.py", err, out)
	requirePattern(t, view, s, 42, "PyTorch's writes seen from Go")
	head, err := whole.Slice(0, off)
	require.NoError(t, err)
	requirePattern(t, head, s, 40, "the bytes before the view")
}

// NewForeignHandle's UUID from the driver's pool fds: say what they are; where it derives
// identities, two pools must never share one (NewForeignHandle would map
// one pool's buffers into another), and dups of one fd always do.
func TestInteropForeignIdentity(t *testing.T) {
	d := cudatest.Device(t)
	p1, p2 := ipcPool(t, d), ipcPool(t, d)
	var hs []*ipc.Handle
	for _, p := range []*resource.DevicePool{p1, p1, p2} {
		h, err := ipc.ExportPool(p)
		require.NoError(t, err)
		defer h.Close()
		hs = append(hs, h)
	}
	// foreignID is the UUID NewForeignHandle derives for a duplicate of
	// fd (an error matching cuda.ErrNotSupported when it derives none).
	foreignID := func(fd int) (ipc.UUID, error) {
		dup, err := syscall.Dup(fd)
		require.NoError(t, err)
		h, derived, err := ipc.NewForeignHandle(dup)
		if err != nil {
			syscall.Close(dup)
			return ipc.UUID{}, err
		}
		defer h.Close()
		if !derived {
			return ipc.UUID{}, fmt.Errorf("fd %d identifies no file: %w", fd, cuda.ErrNotSupported)
		}
		return h.UUID(), nil
	}
	var ids []ipc.UUID
	for i, h := range hs {
		fd, err := h.FD()
		require.NoError(t, err)
		target, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		var st syscall.Stat_t
		require.NoError(t, syscall.Fstat(fd, &st))
		t.Logf("export %d: fd %d -> %q, mode %#o, dev %#x, ino %d, rdev %#x", i, fd, target, st.Mode, st.Dev, st.Ino, st.Rdev)
		id, err := foreignID(fd)
		if errors.Is(err, cuda.ErrNotSupported) {
			t.Skipf("the driver's pool fds carry no identity (%v): NewForeignHandle gives bare fds random UUIDs, as documented", err)
		}
		require.NoError(t, err)
		ids = append(ids, id)
		dup, err := syscall.Dup(fd)
		require.NoError(t, err)
		did, err := foreignID(dup)
		syscall.Close(dup)
		require.NoError(t, err)
		assert.Equal(t, id, did, "a dup of export %d", i)
	}
	assert.NotEqual(t, ids[0], ids[2], "two pools must not share an identity")
	assert.NotEqual(t, ids[1], ids[2], "two pools must not share an identity")
	t.Logf("two exports of one pool share an identity: %v", ids[0] == ids[1])
}
