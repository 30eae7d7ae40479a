//go:build linux

package ipc_test

// More ports of cuda.core's IPC tests (memory_ipc/): test_ipc_concurrent_import
// and, from test_vmm_ipc, the grown buffer imported as one range. The
// roles are added to childRoles here; this file's name sorts after
// ipc_port_gpu_test.go, whose init makes the map, so this init runs after
// it.

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/virtual"
)

func init() {
	childRoles["concurrent"] = roleConcurrent
	childRoles["vmm-grown"] = roleVMMGrown
	childRoles["vmm-socket"] = roleVMMSocket
}

const concurrentImporters = 8

// TestIPCConcurrentImport (cuda.core test_ipc_concurrent_import): in the
// child, several goroutines import the same pool at the same moment, then
// the same buffer descriptor at the same moment, with nothing of it
// mapped before (so the first imports race each other, not a cache):
// none hangs, every import is the one pool, every buffer reads the
// parent's data, and once all are closed nothing is mapped, no fd is left
// open, and the parent sees the data the last importer wrote.
func TestIPCConcurrentImport(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 1, bufSize, 110)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "concurrent", poolEnv(t, h, 110, descs[0]), f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	k.RequireCheck(t, s, bufs[0].Ptr(), bufSize, 120)
	require.NoError(t, bufs[0].Close())
	require.NoError(t, s.Sync())
	attrs, err := p.Attributes()
	require.NoError(t, err)
	assert.Zero(t, attrs.UsedMemCurrent)
}

func roleConcurrent(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	fds := childFDs(t)
	tok, err := childToken()
	require.NoError(t, err)
	h, err := ipc.NewHandle(3, tok)
	require.NoError(t, err)
	desc := decode(t, os.Getenv(envDescs))[0]

	// Every goroutine waits at start, so that the imports begin together.
	var start, done sync.WaitGroup
	start.Add(1)
	pools := make([]*ipc.ImportedPool, concurrentImporters)
	for i := range pools {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			var err error
			pools[i], err = ipc.ImportPool(d, h)
			assert.NoError(t, err, "importer %d", i)
		}()
	}
	start.Done()
	done.Wait()
	require.NoError(t, h.Close())
	p := pools[0]
	require.NotNil(t, p)
	for i, q := range pools {
		assert.Same(t, p, q, "importer %d: a pool imported at once by many maps once", i)
	}

	start.Add(1)
	for i := range concurrentImporters {
		done.Add(1)
		go func() {
			defer done.Done()
			// Each importer has a stream of its own: streams are not
			// shared across goroutines here.
			ms, err := d.NewStream()
			if !assert.NoError(t, err) {
				return
			}
			defer func() { assert.NoError(t, ms.Close()) }()
			start.Wait()
			b, err := p.Import(desc, ms)
			if !assert.NoError(t, err, "importer %d", i) {
				return
			}
			m, err := k.Check(ms, b.Ptr(), desc.Size, uint32(seed))
			assert.NoError(t, err)
			assert.Zero(t, m, "importer %d reads the parent's data", i)
			assert.NoError(t, b.Close())
		}()
	}
	start.Done()
	done.Wait()
	assert.Zero(t, p.Live(), "every import closed")

	// Mapped again after all that, written for the parent to check.
	b, err := p.Import(desc, s)
	require.NoError(t, err)
	require.NoError(t, k.Write(s, b.Ptr(), desc.Size, uint32(seed+10)))
	require.NoError(t, s.Sync())
	require.NoError(t, b.Close())
	require.NoError(t, p.Close())
	_, ok := ipc.Lookup(h.UUID())
	assert.False(t, ok, "the closed pool left the registry")
	testutil.AssertNoNewFDs(t, fds, "no fd leaked")
}

// The pool IPC tests over the fake driver's devices, in a child process:
// the fake shares pools across processes, so the child roles run there
// unchanged, data checked with the test kernels it runs on the host.
func TestIPCImportPortsFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestIPCConcurrentImport", "TestIPCDuplicateImport")
}

// TestVmmIpcGrownBufferImportsAsOneRange (cuda.core test_vmm_ipc
// test_grown_buffer_imports_as_one_range): a virtual buffer grown from one
// granule to two has two physical chunks, each given its own data; it
// exports as two chunks and a child imports them as one contiguous range,
// finding each chunk's data at its offset (the test pattern repeats every
// 256 bytes, so one pattern over the whole range would not tell chunks
// imported out of order), then writes new data to each, which the parent
// sees.
func TestVmmIpcGrownBufferImportsAsOneRange(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	f, err := d.Features()
	require.NoError(t, err)
	if !f.VirtualMemory || !f.PosixFDHandles {
		t.Skip("device cannot export VMM allocations as POSIX fds")
	}
	r, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	g := r.Granularity()
	b, err := r.Allocate(1, s)
	require.NoError(t, err)
	info, err := r.Info(b)
	require.NoError(t, err)
	require.Equal(t, g, info.Mapped, "one byte takes one granule")
	b, err = r.Grow(b, 2*g)
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	require.Equal(t, 2*g, b.Size())
	require.NoError(t, k.Write(s, b.Ptr(), g, 130))
	require.NoError(t, k.Write(s, b.Ptr()+cuda.DevicePtr(g), g, 131))
	require.NoError(t, s.Sync())
	fds := testutil.FDs(t)
	chunks, err := r.Export(b)
	require.NoError(t, err)
	require.Len(t, chunks, 2, "one chunk per physical allocation")
	var files []*os.File
	var sizes []string
	for _, c := range chunks {
		assert.Equal(t, g, c.Size)
		files = append(files, os.NewFile(uintptr(c.FD), "vmm-chunk")) // owns the fd now
		sizes = append(sizes, strconv.FormatUint(c.Size, 10))
	}
	child(t, "vmm-grown", []string{envChunks + "=" + strings.Join(sizes, ","), envSize + "=" + strconv.FormatUint(b.Size(), 10), envSeed + "=130"}, files...)
	for _, f := range files {
		require.NoError(t, f.Close())
	}
	testutil.AssertNoNewFDs(t, fds, "every chunk fd closed")
	k.RequireCheck(t, s, b.Ptr(), g, 140)
	k.RequireCheck(t, s, b.Ptr()+cuda.DevicePtr(g), g, 141)
}

// roleVMMGrown imports the chunks as one buffer, checks chunk i holds
// pattern seed+i, writes seed+10+i to it, and closes everything.
func roleVMMGrown(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	r, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	require.NoError(t, err)
	var chunks []virtual.Chunk
	for i, v := range strings.Split(os.Getenv(envChunks), ",") {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		chunks = append(chunks, virtual.Chunk{FD: 3 + i, Size: n})
	}
	size, err := strconv.ParseUint(os.Getenv(envSize), 10, 64)
	require.NoError(t, err)
	b, err := r.Import(chunks, size)
	require.NoError(t, err)
	require.Equal(t, size, b.Size())
	var off uint64
	for i, c := range chunks {
		at := b.Ptr() + cuda.DevicePtr(off)
		k.RequireCheck(t, s, at, c.Size, uint32(seed+i))
		require.NoError(t, k.Write(s, at, c.Size, uint32(seed+10+i)))
		off += c.Size
	}
	require.NoError(t, s.Sync())
	require.NoError(t, b.Close())
	assert.Empty(t, r.Live())
	require.NoError(t, virtual.CloseChunkFDs(chunks))
}

// TestVmmIpcDescriptorRoundTrip (cuda.core test_vmm_ipc
// test_descriptor_round_trip), over a Unix socket: the chunks' fds and
// sizes go to a child with ipc.SendFDs; the child imports them, finds the
// parent's data, writes its own, closes the import and finds its range
// unmapped; the parent then sees the child's data, and its own fds are
// all closed again.
func TestVmmIpcDescriptorRoundTrip(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	f, err := d.Features()
	require.NoError(t, err)
	if !f.VirtualMemory || !f.PosixFDHandles {
		t.Skip("device cannot export VMM allocations as POSIX fds")
	}
	r, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	b, err := r.Allocate(1, s)
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	require.NoError(t, k.Write(s, b.Ptr(), b.Size(), 150))
	require.NoError(t, s.Sync())

	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	mine, theirs := os.NewFile(uintptr(pair[0]), "parent-end"), os.NewFile(uintptr(pair[1]), "child-end")
	c, err := net.FileConn(mine)
	require.NoError(t, err)
	require.NoError(t, mine.Close())
	conn := c.(*net.UnixConn)
	defer conn.Close()
	fds := testutil.FDs(t)
	chunks, err := r.Export(b)
	require.NoError(t, err)
	var sizes []string
	var chunkFDs []int
	for _, c := range chunks {
		sizes = append(sizes, strconv.FormatUint(c.Size, 10))
		chunkFDs = append(chunkFDs, c.FD)
	}
	payload := fmt.Sprintf("%s;%d", strings.Join(sizes, ","), b.Size())
	require.NoError(t, ipc.SendFDs(conn, []byte(payload), chunkFDs...))
	require.NoError(t, virtual.CloseChunkFDs(chunks), "the child has its own duplicates")
	child(t, "vmm-socket", []string{envSeed + "=150"}, theirs)
	require.NoError(t, theirs.Close())
	testutil.AssertNoNewFDs(t, fds, "the chunks' fds closed")
	k.RequireCheck(t, s, b.Ptr(), b.Size(), 151)
}

func roleVMMSocket(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	f := os.NewFile(3, "socket")
	c, err := net.FileConn(f)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	conn := c.(*net.UnixConn)
	defer conn.Close()
	payload, fds, err := ipc.ReceiveFDs(context.Background(), conn, 1024)
	require.NoError(t, err)
	list, total, ok := strings.Cut(string(payload), ";")
	require.True(t, ok, "payload %q", payload)
	size, err := strconv.ParseUint(total, 10, 64)
	require.NoError(t, err)
	var chunks []virtual.Chunk
	for i, v := range strings.Split(list, ",") {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		require.Less(t, i, len(fds))
		chunks = append(chunks, virtual.Chunk{FD: fds[i], Size: n})
	}
	require.Len(t, fds, len(chunks))
	defer func() { assert.NoError(t, virtual.CloseChunkFDs(chunks)) }()
	r, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandlePosixFD})
	require.NoError(t, err)
	b, err := r.Import(chunks, size)
	require.NoError(t, err)
	require.Equal(t, size, b.Size())
	k.RequireCheck(t, s, b.Ptr(), size, uint32(seed))
	require.NoError(t, k.Write(s, b.Ptr(), size, uint32(seed+1)))
	require.NoError(t, s.Sync())
	ptr := b.Ptr()
	require.NoError(t, b.Close())
	h, err := d.MemRetainAllocationHandle(ptr)
	if err == nil {
		assert.NoError(t, d.MemRelease(h))
	}
	assert.Error(t, err, "the import's range is unmapped once closed")
	assert.Empty(t, r.Live())
}
