//go:build linux

package ipc_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

const (
	envRole = "CUDAMEM_IPC_ROLE"
	// envToken marks the pool Handle's Token (UUID and key) in a child's
	// env list: child and startChild take it out and send it over the
	// child's stdin, as the package says tokens travel (an environment is
	// inherited by grandchildren and readable in /proc/PID/environ);
	// childToken reads it there.
	envToken = "CUDAMEM_IPC_TOKEN"
	envDescs = "CUDAMEM_IPC_DESCS" // hex descriptors, comma-free: concatenated
	envSeed  = "CUDAMEM_IPC_SEED"
)

// childCmd makes the command that runs this test binary's TestChild with
// the given role and env entries, the token among them going to its
// stdin instead of its environment.
func childCmd(role string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run", "^TestChild$", "-test.v"}, args...)...)
	cmd.Env = append(os.Environ(), envRole+"="+role)
	for _, e := range env {
		if tok, ok := strings.CutPrefix(e, envToken+"="); ok {
			cmd.Stdin = strings.NewReader(tok + "\n")
			continue
		}
		cmd.Env = append(cmd.Env, e)
	}
	return cmd
}

// childToken reads the token the parent sent on stdin (see childCmd).
var childToken = sync.OnceValues(func() (string, error) {
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	return strings.TrimSpace(line), err
})

const bufSize = 1 << 20

// childFDs is openFDs in a child role, less descriptor 3: the pool handle
// the parent passed in, which the role closes before it compares.
func childFDs(t *testing.T) map[int]string {
	t.Helper()
	// The runtime opens its poller's descriptors (an epoll and an eventfd)
	// the first time anything waits with a timer or on a pollable file;
	// have it do so now, so that they are in the baseline and not taken
	// for a leak of the code under test.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	require.NoError(t, r.SetReadDeadline(time.Now()))
	r.Close()
	w.Close()
	fds := testutil.FDs(t)
	delete(fds, 3)
	return fds
}

func ipcPool(t *testing.T, d *cuda.Device) *resource.DevicePool {
	t.Helper()
	f, err := d.Features()
	require.NoError(t, err)
	if !f.PoolIPC {
		t.Skip("device cannot export pools as POSIX fds")
	}
	p, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{IPC: true, MaxSize: 64 << 20})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// child runs this test binary's TestChild with the given role.
func child(t *testing.T, role string, env []string, files ...*os.File) {
	t.Helper()
	cmd := childCmd(role, env)
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child %s:\n%s", role, out)
	require.Contains(t, string(out), "--- PASS: TestChild", "child %s:\n%s", role, out)
}

func encode(t *testing.T, ds ...ipc.Descriptor) string {
	var s string
	for _, d := range ds {
		b, err := d.MarshalBinary()
		require.NoError(t, err)
		s += hex.EncodeToString(b)
	}
	return s
}

func decode(t *testing.T, s string) []ipc.Descriptor {
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	require.Zero(t, len(b)%ipc.DescriptorSize)
	var out []ipc.Descriptor
	for i := 0; i < len(b); i += ipc.DescriptorSize {
		var d ipc.Descriptor
		require.NoError(t, d.UnmarshalBinary(b[i:i+ipc.DescriptorSize]))
		out = append(out, d)
	}
	return out
}

// TestIpcMempool: the parent fills a buffer of an IPC pool, a child imports
// the pool (fd through ExtraFiles) and the buffer (descriptor), checks the
// data with a kernel and writes new data, which the parent then sees.
func TestIpcMempool(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	b, err := p.Allocate(bufSize, s)
	require.NoError(t, err)
	require.NoError(t, k.Write(s, b.Ptr(), bufSize, 1))
	require.NoError(t, s.Sync())
	// The buffer is exported before the pool ever was (no warm-up export).
	desc, err := ipc.ExportBuffer(b)
	require.NoError(t, err)
	// The driver opens a descriptor of its own on a pool's first export
	// and keeps it (not a leak of ours): the baseline is taken after it.
	fds := testutil.FDs(t)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	assert.Equal(t, h.UUID(), desc.Pool)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "import", []string{envToken + "=" + h.Token(), envDescs + "=" + encode(t, desc), envSeed + "=1"}, f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	k.RequireCheck(t, s, b.Ptr(), bufSize, 11) // the child wrote seed+10
	require.NoError(t, b.Close())
	require.NoError(t, s.Sync())
	testutil.AssertNoNewFDs(t, fds, "no fd leaked")
	attrs, err := p.Attributes()
	require.NoError(t, err)
	assert.Zero(t, attrs.UsedMemCurrent)
}

// TestIpcOverSocket sends the pool handle and three buffers' descriptors
// over a Unix socket (SCM_RIGHTS) to a child.
func TestIpcOverSocket(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	mine := os.NewFile(uintptr(pair[0]), "parent-end")
	theirs := os.NewFile(uintptr(pair[1]), "child-end")
	c, err := net.FileConn(mine)
	require.NoError(t, err)
	mine.Close()
	conn := c.(*net.UnixConn)
	defer conn.Close()

	var bufs []*buffer.Buffer
	var descs []ipc.Descriptor
	for i := 0; i < 3; i++ {
		b, err := p.Allocate(bufSize, s)
		require.NoError(t, err)
		require.NoError(t, k.Write(s, b.Ptr(), bufSize, uint32(10+i)))
		dsc, err := ipc.ExportBuffer(b)
		require.NoError(t, err)
		bufs, descs = append(bufs, b), append(descs, dsc)
	}
	require.NoError(t, s.Sync())
	fds := testutil.FDs(t) // after the pool's first export (see TestIpcMempool)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, ipc.SendHandle(conn, h))
		payload, _ := hex.DecodeString(encode(t, descs...))
		assert.NoError(t, ipc.SendFDs(conn, payload))
	}()
	child(t, "socket", []string{envSeed + "=10"}, theirs)
	<-done
	theirs.Close()
	require.NoError(t, h.Close())
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), bufSize, uint32(20+i))
		require.NoError(t, b.Close())
	}
	require.NoError(t, s.Sync())
	conn.Close()
	testutil.AssertNoNewFDs(t, fds, "no fd leaked")
}

func TestExportErrors(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	plain, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 16 << 20})
	require.NoError(t, err)
	defer plain.Close()
	_, err = ipc.ExportPool(plain)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "not IPC-enabled")
	b, err := plain.Allocate(1024, s)
	require.NoError(t, err)
	_, err = ipc.ExportBuffer(b)
	assert.Contains(t, err.Error(), "not IPC-enabled")
	require.NoError(t, b.Close())

	p := ipcPool(t, d)
	h0, err := ipc.ExportPool(p)
	require.NoError(t, err)
	first := h0.UUID()
	require.NoError(t, h0.Close())
	fds := testutil.FDs(t) // after the pool's first export (see TestIpcMempool)
	for i := 0; i < 10; i++ {
		h, err := ipc.ExportPool(p)
		require.NoError(t, err)
		assert.Equal(t, first, h.UUID(), "one pool, one UUID")
		require.NoError(t, h.Close())
	}
	testutil.AssertNoNewFDs(t, fds, "10 exports leak no fd")
	b, err = p.Allocate(4096, s)
	require.NoError(t, err)
	v, err := b.Slice(0, 1024)
	require.NoError(t, err)
	_, err = ipc.ExportBuffer(v)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a view cannot be exported")
	require.NoError(t, b.Close())
	_, err = ipc.ExportBuffer(b)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	other := ipcPool(t, d)
	h2, err := ipc.ExportPool(other)
	require.NoError(t, err)
	defer h2.Close()
	assert.NotEqual(t, first, h2.UUID())
}

func TestIpcLegacy(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r, err := resource.NewSyncDevice(d)
	require.NoError(t, err)
	b, err := r.Allocate(bufSize, s)
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, k.Write(s, b.Ptr(), bufSize, 30))
	require.NoError(t, s.Sync())
	lh, err := ipc.ExportLegacy(b)
	require.NoError(t, err)
	enc, err := lh.MarshalBinary()
	require.NoError(t, err)
	child(t, "legacy", []string{envDescs + "=" + hex.EncodeToString(enc), envSeed + "=30"})
	k.RequireCheck(t, s, b.Ptr(), bufSize, 31)
	var bad ipc.LegacyHandle
	assert.ErrorIs(t, bad.UnmarshalBinary(enc[:10]), ipc.ErrBadDescriptor)
}

// TestChild is the child side of the multi-process tests.
func TestChild(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("run as a child process by the IPC tests")
	}
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	seed, err := strconv.Atoi(os.Getenv(envSeed))
	require.NoError(t, err)
	switch role {
	case "import":
		tok, err := childToken()
		require.NoError(t, err)
		h, err := ipc.NewHandle(3, tok)
		require.NoError(t, err)
		require.True(t, h.HasKey())
		defer h.Close()
		importAndCheck(t, d, s, k, h, decode(t, os.Getenv(envDescs)), seed)
	case "socket":
		f := os.NewFile(3, "socket")
		c, err := net.FileConn(f)
		require.NoError(t, err)
		f.Close()
		conn := c.(*net.UnixConn)
		defer conn.Close()
		h, err := ipc.ReceiveHandle(context.Background(), conn)
		require.NoError(t, err)
		defer h.Close()
		require.True(t, h.HasKey(), "the pool key came with the fd")
		payload, fds, err := ipc.ReceiveFDs(context.Background(), conn, 16*ipc.DescriptorSize)
		require.NoError(t, err)
		require.Empty(t, fds)
		importAndCheck(t, d, s, k, h, decode(t, hex.EncodeToString(payload)), seed)
	case "legacy":
		enc, err := hex.DecodeString(os.Getenv(envDescs))
		require.NoError(t, err)
		var lh ipc.LegacyHandle
		require.NoError(t, lh.UnmarshalBinary(enc))
		b, err := ipc.OpenLegacy(d, lh)
		require.NoError(t, err)
		k.RequireCheck(t, s, b.Ptr(), lh.Size, uint32(seed))
		require.NoError(t, k.Write(s, b.Ptr(), lh.Size, uint32(seed+1)))
		require.NoError(t, s.Sync())
		require.NoError(t, b.Close())
	default:
		fn, ok := childRoles[role]
		if !ok {
			t.Fatalf("unknown role %q", role)
		}
		fn(t, d, s, k, seed)
	}
}

func importAndCheck(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, h *ipc.Handle, descs []ipc.Descriptor, seed int) {
	p, err := ipc.ImportPool(d, h)
	require.NoError(t, err)
	again, err := ipc.ImportPool(d, h)
	require.NoError(t, err)
	assert.Same(t, p, again, "a pool imported twice maps once")
	found, ok := ipc.Lookup(h.UUID())
	assert.True(t, ok)
	assert.Same(t, p, found)
	_, err = p.Allocate(1024, s)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot allocate from an imported")
	wrong := descs[0]
	wrong.Pool = cuda.NewUUID()
	_, err = p.Import(wrong, s)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "descriptor of another pool")
	forged := descs[0]
	forged.Data.Reserved[5] ^= 0x10
	_, err = p.Import(forged, s)
	assert.ErrorIs(t, err, ipc.ErrBadDescriptor, "altered export data: refused before the driver")
	// Re-export: the same UUID, the same descriptors.
	h2, err := ipc.ExportPool(p)
	require.NoError(t, err)
	assert.Equal(t, h.UUID(), h2.UUID())
	assert.Equal(t, h.Token(), h2.Token(), "re-exported with the same key")
	require.NoError(t, h2.Close())
	for i, desc := range descs {
		b, err := p.Import(desc, s)
		require.NoError(t, err)
		re, err := ipc.ExportBuffer(b)
		require.NoError(t, err)
		assert.Equal(t, desc, re)
		k.RequireCheck(t, s, b.Ptr(), desc.Size, uint32(seed+i))
		require.NoError(t, k.Write(s, b.Ptr(), desc.Size, uint32(seed+10+i)))
		require.NoError(t, s.Sync())
		require.NoError(t, b.Close())
	}
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	_, ok = ipc.Lookup(h.UUID())
	assert.False(t, ok, "closed pools leave the registry")
}
