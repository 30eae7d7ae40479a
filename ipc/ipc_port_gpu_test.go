//go:build linux

package ipc_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
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
	"github.com/cudamem/cudamem/virtual"
)

func hexString(b []byte) string { return hex.EncodeToString(b) }

func hexBytes(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// Ported cuda.core IPC tests (memory_ipc/) and the hostile-input tests of
// issue 7. Every test re-executes this test binary as its children
// (TestChild, with a role from childRoles).

const (
	envChunks = "CUDAMEM_IPC_CHUNKS" // comma-separated VMM chunk sizes
	envSize   = "CUDAMEM_IPC_SIZE"
)

type roleFunc func(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int)

var childRoles map[string]roleFunc

func init() {
	childRoles = map[string]roleFunc{
		"reexport-b":       roleReexportB,
		"duplicate":        roleDuplicate,
		"oversized":        roleOversized,
		"legacy-oversized": roleLegacyOversized,
		"vmm":              roleVMM,
		"peer":             rolePeer,
		"worker":           roleWorker,
		"hold":             roleHold,
		"hostile":          roleHostile,
		"close-race":       roleCloseRace,
	}
}

// childProc is a child started without waiting for it.
type childProc struct {
	role string
	cmd  *exec.Cmd
	out  bytes.Buffer
}

func startChild(t *testing.T, role string, env []string, files ...*os.File) *childProc {
	t.Helper()
	c := &childProc{role: role}
	c.cmd = childCmd(role, env, "-test.timeout", "5m")
	c.cmd.ExtraFiles = files
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	require.NoError(t, c.cmd.Start())
	return c
}

func (c *childProc) wait(t *testing.T) {
	t.Helper()
	err := c.cmd.Wait()
	require.NoError(t, err, "child %s:\n%s", c.role, c.out.String())
	require.Contains(t, c.out.String(), "--- PASS: TestChild", "child %s:\n%s", c.role, c.out.String())
}

// importFromEnv imports the pool on fd 3 under the token (UUID and pool
// key) the parent sent on stdin.
func importFromEnv(t *testing.T, d *cuda.Device) (*ipc.ImportedPool, *ipc.Handle) {
	t.Helper()
	tok, err := childToken()
	require.NoError(t, err)
	h, err := ipc.NewHandle(3, tok)
	require.NoError(t, err)
	require.True(t, h.HasKey(), "the token carries the pool key")
	p, err := ipc.ImportPool(d, h)
	require.NoError(t, err)
	return p, h
}

func poolEnv(t *testing.T, h *ipc.Handle, seed int, ds ...ipc.Descriptor) []string {
	return []string{envToken + "=" + h.Token(), envDescs + "=" + encode(t, ds...), envSeed + "=" + strconv.Itoa(seed)}
}

// writeBuffers allocates n buffers of size bytes from p, writes seed+i to
// buffer i and exports each.
func writeBuffers(t *testing.T, p ipc.ExportablePool, s *cuda.Stream, k *cudatest.Kernels, n int, size uint64, seed int) ([]*buffer.Buffer, []ipc.Descriptor) {
	t.Helper()
	var bufs []*buffer.Buffer
	var descs []ipc.Descriptor
	for i := range n {
		b, err := buffer.Allocate(p, size, s)
		require.NoError(t, err)
		require.NoError(t, k.Write(s, b.Ptr(), size, uint32(seed+i)))
		bufs = append(bufs, b)
	}
	require.NoError(t, s.Sync())
	for _, b := range bufs {
		d, err := ipc.ExportBuffer(b)
		require.NoError(t, err)
		descs = append(descs, d)
	}
	return bufs, descs
}

// TestExportBufferBeforePoolExport: ExportBuffer works on an IPC pool that
// was never exported (the driver refuses cuMemPoolExportPointer until the
// pool's first export; this used to fail with CUDA_ERROR_INVALID_VALUE),
// also from many goroutines at once on a fresh pool.
func TestExportBufferBeforePoolExport(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	p := ipcPool(t, d)
	b, err := p.Allocate(4096, s)
	require.NoError(t, err)
	defer b.Close()
	desc, err := ipc.ExportBuffer(b)
	require.NoError(t, err, "first export of a never-exported pool")
	assert.Equal(t, uint64(4096), desc.Size)

	fresh := ipcPool(t, d)
	var bufs []*buffer.Buffer
	for range 8 {
		b, err := fresh.Allocate(4096, s)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	require.NoError(t, s.Sync())
	var wg sync.WaitGroup
	for _, b := range bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := ipc.ExportBuffer(b)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	for _, b := range bufs {
		require.NoError(t, b.Close())
	}
}

// TestExportPoolRacesClose exports pools while they are being closed: every
// export either succeeds (and its handle closes) or reports ErrClosed;
// the driver never sees a destroyed pool.
func TestExportPoolRacesClose(t *testing.T) {
	d := cudatest.Device(t)
	for range 20 {
		p := ipcPool(t, d)
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					h, err := ipc.ExportPool(p)
					if err != nil {
						assert.ErrorIs(t, err, cuda.ErrClosed)
						return
					}
					assert.NoError(t, h.Close())
				}
			}()
		}
		time.Sleep(time.Millisecond)
		require.NoError(t, p.Close())
		wg.Wait()
	}
}

// TestIPCMempoolMultiple: two buffers go to two children running at once,
// each with its own export of the pool; each child checks and refills
// its buffer, and the parent sees both.
func TestIPCMempoolMultiple(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 2, bufSize, 1)
	var kids []*childProc
	for i := range 2 {
		h, err := ipc.ExportPool(p)
		require.NoError(t, err)
		f, err := h.ExtraFile()
		require.NoError(t, err)
		kids = append(kids, startChild(t, "import", poolEnv(t, h, 1+i, descs[i]), f))
		require.NoError(t, f.Close())
		require.NoError(t, h.Close())
	}
	for _, c := range kids {
		c.wait(t)
	}
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), bufSize, uint32(11+i)) // child i wrote its seed+10
		require.NoError(t, b.Close())
	}
}

// TestIPCSharedAllocationHandleAndBufferDescriptors: one allocation handle
// goes to two children at once; each imports the pool from it and a
// different buffer from its descriptor.
func TestIPCSharedAllocationHandleAndBufferDescriptors(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 2, bufSize, 5)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	defer h.Close()
	var kids []*childProc
	for i := range 2 {
		f, err := h.ExtraFile()
		require.NoError(t, err)
		kids = append(kids, startChild(t, "import", poolEnv(t, h, 5+i, descs[i]), f))
		require.NoError(t, f.Close())
	}
	for _, c := range kids {
		c.wait(t)
	}
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), bufSize, uint32(15+i))
		require.NoError(t, b.Close())
	}
}

// TestIpcReexport: A exports a pool and a buffer to B; B imports both,
// checks and rewrites the data, re-exports the imported pool and buffer to
// C, which checks B's data and writes its own; B and then A see C's data.
func TestIpcReexport(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 1, bufSize, 40)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "reexport-b", poolEnv(t, h, 40, descs[0]), f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	k.RequireCheck(t, s, bufs[0].Ptr(), bufSize, 60) // written by C
	require.NoError(t, bufs[0].Close())
}

func roleReexportB(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	p, h := importFromEnv(t, d)
	defer h.Close()
	desc := decode(t, os.Getenv(envDescs))[0]
	b, err := p.Import(desc, s)
	require.NoError(t, err)
	k.RequireCheck(t, s, b.Ptr(), desc.Size, uint32(seed))
	require.NoError(t, k.Write(s, b.Ptr(), desc.Size, uint32(seed+10)))
	require.NoError(t, s.Sync())
	h2, err := ipc.ExportPool(p)
	require.NoError(t, err)
	re, err := ipc.ExportBuffer(b)
	require.NoError(t, err)
	assert.Equal(t, desc, re)
	f, err := h2.ExtraFile()
	require.NoError(t, err)
	// C checks seed+10 and writes seed+20 ("import" writes its seed+10).
	child(t, "import", poolEnv(t, h2, seed+10, re), f)
	require.NoError(t, f.Close())
	require.NoError(t, h2.Close())
	k.RequireCheck(t, s, b.Ptr(), desc.Size, uint32(seed+20))
	require.NoError(t, b.Close())
	require.NoError(t, p.Close())
}

// TestIPCDuplicateImport (cuda.core test_ipc_duplicate_import): the child
// imports one descriptor twice, and many times from many goroutines; the
// driver returns one mapping, every Buffer works until its own Close,
// every Close succeeds, and the pool is destroyed after the last.
func TestIPCDuplicateImport(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 1, bufSize, 70)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "duplicate", poolEnv(t, h, 70, descs[0]), f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	k.RequireCheck(t, s, bufs[0].Ptr(), bufSize, 80)
	require.NoError(t, bufs[0].Close())
	require.NoError(t, s.Sync())
	attrs, err := p.Attributes()
	require.NoError(t, err)
	assert.Zero(t, attrs.UsedMemCurrent)
}

func roleDuplicate(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	fds := childFDs(t)
	p, h := importFromEnv(t, d)
	require.NoError(t, h.Close())
	desc := decode(t, os.Getenv(envDescs))[0]
	b1, err := p.Import(desc, s)
	require.NoError(t, err)
	b2, err := p.Import(desc, s)
	require.NoError(t, err)
	t.Logf("imports at %#x and %#x", uint64(b1.Ptr()), uint64(b2.Ptr()))
	assert.Equal(t, int64(2), p.Live())
	k.RequireCheck(t, s, b1.Ptr(), desc.Size, uint32(seed))
	require.NoError(t, b1.Close())
	k.RequireCheck(t, s, b2.Ptr(), desc.Size, uint32(seed)) // still mapped
	// Many goroutines importing and closing the same descriptor.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				b, err := p.Import(desc, s)
				if !assert.NoError(t, err) {
					return
				}
				m, err := k.Check(s, b.Ptr(), desc.Size, uint32(seed))
				assert.NoError(t, err)
				assert.Zero(t, m)
				assert.NoError(t, b.Close())
			}
		}()
	}
	wg.Wait()
	require.NoError(t, k.Write(s, b2.Ptr(), desc.Size, uint32(seed+10)))
	require.NoError(t, s.Sync())
	require.NoError(t, p.Close())
	assert.True(t, p.IsClosed())
	require.NoError(t, b2.Close(), "the last Close frees (and destroys the closed pool)")
	assert.Zero(t, p.Live())
	require.NoError(t, p.Close())
	testutil.AssertNoNewFDs(t, fds, "no fd leaked")
}

// TestImportOversizedBufferDescriptorSize: descriptors claiming more than
// the exported allocation (up to sizes near 2^64, which wrapped the old
// bounds check) are refused; a refusal after a valid import of the same
// allocation leaves that import working and its Close succeeding. The
// size is under the MAC, so a changed size alone is refused before the
// driver; the lies here carry a valid MAC (sealed with the pool key the
// child holds, as a peer holding the key could), so they reach the
// driver and the bounds check against its mapping.
func TestImportOversizedBufferDescriptorSize(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 1, bufSize, 90)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "oversized", poolEnv(t, h, 90, descs[0]), f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	k.RequireCheck(t, s, bufs[0].Ptr(), bufSize, 90)
	require.NoError(t, bufs[0].Close())
}

func roleOversized(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	p, h := importFromEnv(t, d)
	defer h.Close()
	desc := decode(t, os.Getenv(envDescs))[0]
	for _, size := range []uint64{desc.Size * 2, desc.Size + 1<<30, math.MaxUint64, math.MaxUint64 - 4095} {
		bad := desc
		bad.Size = size
		b, err := p.Import(bad, s)
		require.ErrorIs(t, err, ipc.ErrBadDescriptor, "size %d changed without the key", size)
		assert.Nil(t, b)
		bad = ipc.SealWithHandleKey(h, bad)
		b, err = p.Import(bad, s)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "size %d", size)
		// Every refused descriptor matches ErrBadDescriptor; an authentic
		// one is refused by the bounds check, not the MAC.
		assert.ErrorIs(t, err, ipc.ErrBadDescriptor)
		assert.NotContains(t, err.Error(), "not authenticated", "authenticated: refused by the bounds check")
		assert.Contains(t, err.Error(), "the imported allocation holds")
		assert.Nil(t, b)
	}
	good, err := p.Import(desc, s)
	require.NoError(t, err)
	for _, size := range []uint64{desc.Size + 1, math.MaxUint64} {
		bad := desc
		bad.Size = size
		_, err := p.Import(ipc.SealWithHandleKey(h, bad), s)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "the imported allocation holds")
	}
	k.RequireCheck(t, s, good.Ptr(), desc.Size, uint32(seed)) // still mapped
	require.NoError(t, good.Close(), "the refusals did not free it")
	assert.Zero(t, p.Live())
	require.NoError(t, p.Close())
}

// TestImportOversizedLegacyHandle: a legacy handle claiming more than the
// allocation is refused by the importer.
func TestImportOversizedLegacyHandle(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r, err := resource.NewSyncDevice(d)
	require.NoError(t, err)
	b, err := r.Allocate(bufSize, s)
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, k.Write(s, b.Ptr(), bufSize, 33))
	require.NoError(t, s.Sync())
	lh, err := ipc.ExportLegacy(b)
	require.NoError(t, err)
	enc, err := lh.MarshalBinary()
	require.NoError(t, err)
	child(t, "legacy-oversized", []string{envDescs + "=" + hexString(enc), envSeed + "=33"})
}

func roleLegacyOversized(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	enc := hexBytes(t, os.Getenv(envDescs))
	var lh ipc.LegacyHandle
	require.NoError(t, lh.UnmarshalBinary(enc))
	for _, size := range []uint64{lh.Size + 1, lh.Size * 64, math.MaxUint64} {
		bad := lh
		bad.Size = size
		_, err := ipc.OpenLegacy(d, bad)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "size %d", size)
	}
	b, err := ipc.OpenLegacy(d, lh)
	require.NoError(t, err)
	k.RequireCheck(t, s, b.Ptr(), lh.Size, uint32(seed))
	require.NoError(t, b.Close())
}

// TestIpcVMMGrownRoundTrip: a VMM allocation is written, grown (its data
// kept), exported as chunks and imported by a child, which checks and
// rewrites all of it; the parent sees the child's data.
func TestIpcVMMGrownRoundTrip(t *testing.T) {
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
	b, err := r.Allocate(g, s)
	require.NoError(t, err)
	require.NoError(t, k.Write(s, b.Ptr(), g, 50))
	require.NoError(t, s.Sync())
	b, err = r.Grow(b, 3*g+1)
	require.NoError(t, err)
	defer b.Close()
	k.RequireCheck(t, s, b.Ptr(), g, 50) // growth kept the data
	require.NoError(t, k.Write(s, b.Ptr(), b.Size(), 51))
	require.NoError(t, s.Sync())
	fds := testutil.FDs(t)
	chunks, err := r.Export(b)
	require.NoError(t, err)
	var files []*os.File
	var sizes []string
	for _, c := range chunks {
		files = append(files, os.NewFile(uintptr(c.FD), "vmm-chunk")) // owns the fd now
		sizes = append(sizes, strconv.FormatUint(c.Size, 10))
	}
	child(t, "vmm", []string{envChunks + "=" + strings.Join(sizes, ","), envSize + "=" + strconv.FormatUint(b.Size(), 10), envSeed + "=51"}, files...)
	for _, f := range files {
		require.NoError(t, f.Close())
	}
	testutil.AssertNoNewFDs(t, fds, "every chunk fd closed")
	k.RequireCheck(t, s, b.Ptr(), b.Size(), 52)
}

func roleVMM(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
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
	k.RequireCheck(t, s, b.Ptr(), size, uint32(seed))
	require.NoError(t, k.Write(s, b.Ptr(), size, uint32(seed+1)))
	require.NoError(t, s.Sync())
	require.NoError(t, b.Close())
	require.NoError(t, virtual.CloseChunkFDs(chunks))
}

// TestIpcPeerAccess (memory_ipc/test_peer_access): a child imports a pool
// of GPU 0, grants GPU 1 access to the imported pool (access is not
// carried over from the exporter), and checks and rewrites the buffer with
// kernels on GPU 1.
func TestIpcPeerAccess(t *testing.T) {
	ds := cudatest.Devices(t, 2)
	ok, err := ds[1].CanAccessPeer(ds[0])
	require.NoError(t, err)
	if !ok {
		t.Skip("GPU 1 cannot access GPU 0's memory")
	}
	d := ds[0]
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 1, bufSize, 100)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "peer", poolEnv(t, h, 100, descs[0]), f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	k.RequireCheck(t, s, bufs[0].Ptr(), bufSize, 101)
	require.NoError(t, bufs[0].Close())
}

func rolePeer(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	ds := cudatest.Devices(t, 2)
	peer := ds[1]
	ps := cudatest.Stream(t, peer)
	pk := cudatest.LoadKernels(t, peer)
	p, h := importFromEnv(t, d)
	defer h.Close()
	require.NoError(t, p.Pool().SetAccess(cuda.MemAccessDesc{
		Location: cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(peer.Ordinal())},
		Flags:    cuda.MemAccessProtReadWrite,
	}))
	desc := decode(t, os.Getenv(envDescs))[0]
	b, err := p.Import(desc, s)
	require.NoError(t, err)
	pk.RequireCheck(t, ps, b.Ptr(), desc.Size, uint32(seed))
	require.NoError(t, pk.Write(ps, b.Ptr(), desc.Size, uint32(seed+1)))
	require.NoError(t, ps.Sync())
	k.RequireCheck(t, s, b.Ptr(), desc.Size, uint32(seed+1))
	require.NoError(t, b.Close())
	require.NoError(t, p.Close())
}

// TestIpcWorkerPool (TestIpcWorkerPool): four children at once each import
// 16 buffers from 8 goroutines, check and rewrite them and close them;
// fds and live buffers are back to their baseline in every child, and the
// parent's pool is empty once it closes its buffers.
func TestIpcWorkerPool(t *testing.T) {
	const workers, per = 4, 16
	const size = 64 << 10
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, workers*per, size, 1000)
	fds := testutil.FDs(t)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	var kids []*childProc
	for w := range workers {
		f, err := h.ExtraFile()
		require.NoError(t, err)
		kids = append(kids, startChild(t, "worker", poolEnv(t, h, 1000+w*per, descs[w*per:(w+1)*per]...), f))
		require.NoError(t, f.Close())
	}
	for _, c := range kids {
		c.wait(t)
	}
	require.NoError(t, h.Close())
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), size, uint32(1000+i+500))
		require.NoError(t, b.Close())
	}
	require.NoError(t, s.Sync())
	attrs, err := p.Attributes()
	require.NoError(t, err)
	assert.Zero(t, attrs.UsedMemCurrent, "pool bytes back to 0")
	testutil.AssertNoNewFDs(t, fds, "no fd leaked in the parent")
}

func roleWorker(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	fds := childFDs(t)
	p, h := importFromEnv(t, d)
	descs := decode(t, os.Getenv(envDescs))
	bufs := make([]*buffer.Buffer, len(descs))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				b, err := p.Import(descs[i], s)
				if !assert.NoError(t, err) {
					continue
				}
				m, err := k.Check(s, b.Ptr(), descs[i].Size, uint32(seed+i))
				assert.NoError(t, err)
				assert.Zero(t, m, "buffer %d", i)
				assert.NoError(t, k.Write(s, b.Ptr(), descs[i].Size, uint32(seed+i+500)))
				bufs[i] = b
			}
		}()
	}
	for i := range descs {
		next <- i
	}
	close(next)
	wg.Wait()
	require.NoError(t, s.Sync())
	for _, b := range bufs {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, b.Close()) }()
	}
	wg.Wait()
	assert.Zero(t, p.Live())
	require.NoError(t, p.Close())
	require.NoError(t, h.Close())
	testutil.AssertNoNewFDs(t, fds, "fds back to baseline in the child")
}

// TestIpcChildKilled: a child killed with SIGKILL while it holds imported
// memory leaves the parent's data intact and its pool usable.
func TestIpcChildKilled(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	bufs, descs := writeBuffers(t, p, s, k, 2, bufSize, 120)
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	c := startChild(t, "hold", poolEnv(t, h, 120, descs...), f, w)
	require.NoError(t, f.Close())
	require.NoError(t, w.Close())
	ready := make([]byte, 1)
	n, err := r.Read(ready) // the child imported and checked everything
	if err != nil || n != 1 {
		_ = c.cmd.Wait() // the child is gone: its output is complete
		t.Fatalf("child did not get ready (%v):\n%s", err, c.out.String())
	}
	require.NoError(t, r.Close())
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	err = c.cmd.Wait()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "killed: %v", err)
	require.NoError(t, h.Close())

	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), bufSize, uint32(120+i))
	}
	// The pool still allocates, exports and frees.
	more, moreDescs := writeBuffers(t, p, s, k, 1, bufSize, 130)
	assert.NotEqual(t, descs[0].Data, moreDescs[0].Data)
	k.RequireCheck(t, s, more[0].Ptr(), bufSize, 130)
	for _, b := range append(bufs, more...) {
		require.NoError(t, b.Close())
	}
	require.NoError(t, s.Sync())
	attrs, err := p.Attributes()
	require.NoError(t, err)
	assert.Zero(t, attrs.UsedMemCurrent)
}

func roleHold(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	p, h := importFromEnv(t, d)
	defer h.Close()
	for i, desc := range decode(t, os.Getenv(envDescs)) {
		b, err := p.Import(desc, s)
		require.NoError(t, err)
		k.RequireCheck(t, s, b.Ptr(), desc.Size, uint32(seed+i))
		// Held open, deliberately: the parent kills us now.
	}
	ready := os.NewFile(4, "ready")
	_, err := ready.Write([]byte{1})
	require.NoError(t, err)
	time.Sleep(2 * time.Minute)
	t.Fatal("not killed")
}

// TestIpcHostileDescriptors feeds a child thousands of random and mutated
// descriptors with valid checksums for a real pool. On the first GPU run
// (H200, driver 580) mutated export data crashed the child with SIGSEGV
// inside cuMemPoolImportPointer: the driver does not validate it. Now
// every descriptor the pool key does not authenticate is refused before
// the driver sees it; lies sealed with the real key (a peer holding it)
// still reach the driver only with the genuine export data, and their
// sizes are bounded by the mapping. The child never crashes, never returns
// a Buffer that reaches past a mapping, and leaks neither fds nor imports;
// the parent's data is untouched.
func TestIpcHostileDescriptors(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	p := ipcPool(t, d)
	var bufs []*buffer.Buffer
	var descs []ipc.Descriptor
	for i, size := range []uint64{4096, bufSize, 3 << 20} {
		b, dd := writeBuffers(t, p, s, k, 1, size, 200+i)
		bufs, descs = append(bufs, b...), append(descs, dd...)
	}
	h, err := ipc.ExportPool(p)
	require.NoError(t, err)
	f, err := h.ExtraFile()
	require.NoError(t, err)
	child(t, "hostile", poolEnv(t, h, 200, descs...), f)
	require.NoError(t, f.Close())
	require.NoError(t, h.Close())
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), b.Size(), uint32(200+i))
		require.NoError(t, b.Close())
	}
}

func roleHostile(t *testing.T, d *cuda.Device, s *cuda.Stream, k *cudatest.Kernels, seed int) {
	const rounds = 3000
	fds := childFDs(t)
	p, h := importFromEnv(t, d)
	descs := decode(t, os.Getenv(envDescs))
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	var held []*buffer.Buffer
	var refusedMAC, sealedLies, refusedBounds, accepted int
	for i := range rounds {
		base := descs[rng.IntN(len(descs))]
		m := base
		// Sizes may be sealed with the real key below; export data and
		// MACs never are: the driver must not see altered export data.
		sizeOnly := true
		switch i % 8 {
		case 0:
			m.Size = rng.Uint64()
		case 1:
			m.Size = math.MaxUint64 - rng.Uint64N(1<<21)
		case 2:
			m.Size = base.Size + 1 + rng.Uint64N(4<<20)
		case 3:
			for range 1 + rng.IntN(4) {
				m.Data.Reserved[rng.IntN(len(m.Data.Reserved))] ^= byte(1 << rng.IntN(8))
			}
			sizeOnly = false
		case 4:
			for j := range m.Data.Reserved {
				m.Data.Reserved[j] = byte(rng.Uint32())
			}
			m.Size = 1 + rng.Uint64N(base.Size)
			sizeOnly = false
		case 5:
			m.Size = 1 + rng.Uint64N(base.Size) // a prefix
		case 6:
			for j := range m.MAC {
				m.MAC[j] = byte(rng.Uint32())
			}
			sizeOnly = false
		case 7:
			// genuine
		}
		sealed := false
		if sizeOnly && m != base && rng.IntN(2) == 0 {
			m = ipc.SealWithHandleKey(h, m)
			sealed = true
			sealedLies++
		}
		// Through the wire format, as from another process: the checksum
		// is valid, so only the importer's own checks stand in the way.
		enc, err := m.MarshalBinary()
		require.NoError(t, err)
		var got ipc.Descriptor
		require.NoError(t, got.UnmarshalBinary(enc))
		b, err := p.Import(got, s)
		if m != base && !sealed {
			// Not authenticated: refused before the driver (the driver
			// crashed on such export data before).
			require.ErrorIs(t, err, ipc.ErrBadDescriptor, "round %d: an altered descriptor was not refused", i)
			require.Contains(t, err.Error(), "not authenticated", "round %d", i)
			assert.Nil(t, b)
			refusedMAC++
			continue
		}
		if err != nil {
			// Authentic but lying about its size: bounded by the mapping.
			require.True(t, sealed, "round %d: a genuine descriptor was refused: %v", i, err)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument, "round %d", i)
			require.ErrorIs(t, err, ipc.ErrBadDescriptor, "round %d", i)
			require.NotContains(t, err.Error(), "not authenticated", "round %d: a sealed descriptor failed the MAC", i)
			refusedBounds++
			continue
		}
		accepted++
		info, err := cuda.QueryPointer(b.Ptr())
		require.NoError(t, err)
		require.GreaterOrEqual(t, uint64(b.Ptr()), uint64(info.RangeBase), "round %d", i)
		off := uint64(b.Ptr() - info.RangeBase)
		require.LessOrEqual(t, off, info.RangeSize, "round %d", i)
		require.LessOrEqual(t, b.Size(), info.RangeSize-off, "round %d: a Buffer past its mapping", i)
		held = append(held, b)
		if len(held) > 4 { // keep a few open: duplicates share mappings
			require.NoError(t, held[0].Close(), "round %d", i)
			held = held[1:]
		}
	}
	t.Logf("%d forged descriptors refused before the driver, %d lies sealed with the key (%d refused by the bounds check), %d accepted",
		refusedMAC, sealedLies, refusedBounds, accepted)
	assert.Greater(t, refusedMAC, rounds/2, "most rounds were forged")
	assert.Positive(t, accepted)
	assert.Positive(t, refusedBounds)
	for _, b := range held {
		require.NoError(t, b.Close())
	}
	assert.Zero(t, p.Live(), "no import leaked")
	// The real descriptors still work after all that.
	for i, desc := range descs {
		b, err := p.Import(desc, s)
		require.NoError(t, err)
		k.RequireCheck(t, s, b.Ptr(), desc.Size, uint32(seed+i))
		require.NoError(t, b.Close())
	}
	require.NoError(t, p.Close())
	require.NoError(t, h.Close())
	testutil.AssertNoNewFDs(t, fds, "no fd leaked")
}
