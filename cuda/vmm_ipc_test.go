package cuda_test

import (
	"encoding/hex"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

func TestVMMCycle(t *testing.T) {
	d := cudatest.Device(t)
	f, err := d.Features()
	require.NoError(t, err)
	if !f.VirtualMemory {
		t.Skip("device has no virtual memory management")
	}
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	loc := cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())}
	prop := &cuda.MemAllocationProp{Type: cuda.MemAllocationTypePinned, Location: loc,
		RequestedHandleTypes: cuda.MemHandleTypePosixFileDescriptor}
	g, err := d.AllocationGranularity(prop, cuda.MemAllocationGranularityRecommended)
	require.NoError(t, err)
	require.NotZero(t, g)
	size := 2 * g
	h, err := d.MemCreate(size, prop)
	require.NoError(t, err)
	got, err := d.MemAllocationProperties(h)
	require.NoError(t, err)
	assert.Equal(t, loc, got.Location)
	ptr, err := d.MemAddressReserve(size, g, 0)
	require.NoError(t, err)
	require.NoError(t, d.MemMap(ptr, size, 0, h))
	require.NoError(t, d.MemSetAccess(ptr, size, cuda.MemAccessDesc{Location: loc, Flags: cuda.MemAccessProtReadWrite}))
	acc, err := d.MemGetAccess(ptr, loc)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemAccessProtReadWrite, acc)
	require.NoError(t, k.Write(s, ptr, size, 11))
	k.RequireCheck(t, s, ptr, size, 11)

	h2, err := d.MemRetainAllocationHandle(ptr)
	require.NoError(t, err)
	require.NoError(t, d.MemRelease(h2))

	fd, err := d.MemExportFD(h)
	require.NoError(t, err)
	imported, err := d.MemImportFD(fd)
	require.NoError(t, err)
	require.NoError(t, os.NewFile(uintptr(fd), "vmm").Close())
	require.NoError(t, d.MemRelease(imported))

	require.NoError(t, d.MemUnmap(ptr, size))
	require.NoError(t, d.MemAddressFree(ptr, size))
	require.NoError(t, d.MemRelease(h))
	_, err = d.MemImportFD(-1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

const envIPCChild = "CUDAMEM_TEST_LEGACY_IPC_HANDLE"

// TestLegacyIPC exports memory from cuMemAlloc with cuIpcGetMemHandle and
// has a child process (this test binary, re-executed) open it, check the
// parent's data with a kernel and write new data the parent then sees.
func TestLegacyIPC(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	const n = 1 << 20
	p, err := d.MemAlloc(n)
	require.NoError(t, err)
	defer d.MemFree(p)
	require.NoError(t, k.Write(s, p, n, 21))
	require.NoError(t, s.Sync())
	h, err := d.IPCGetMemHandle(p)
	require.NoError(t, err)

	cmd := exec.Command(os.Args[0], "-test.run", "^TestLegacyIPCChild$", "-test.v")
	cmd.Env = append(os.Environ(), envIPCChild+"="+hex.EncodeToString(h.Reserved[:]))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestLegacyIPCChild")
	k.RequireCheck(t, s, p, n, 22)
}

func TestLegacyIPCChild(t *testing.T) {
	hx := os.Getenv(envIPCChild)
	if hx == "" {
		t.Skip("run by TestLegacyIPC in a child process")
	}
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	var h cuda.IPCMemHandle
	b, err := hex.DecodeString(hx)
	require.NoError(t, err)
	copy(h.Reserved[:], b)
	p, err := d.IPCOpenMemHandle(h, cuda.IPCMemLazyEnablePeerAccess)
	require.NoError(t, err)
	k.RequireCheck(t, s, p, 1<<20, 21)
	require.NoError(t, k.Write(s, p, 1<<20, 22))
	require.NoError(t, s.Sync())
	require.NoError(t, d.IPCCloseMemHandle(p))
}
