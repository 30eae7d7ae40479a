package virtual_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/virtual"
)

// fabricUnavailable reports whether err is the clean "no fabric handles
// here" answer (ErrNotSupported naming IMEX); any other error fails t.
func fabricUnavailable(t *testing.T, step string, err error) bool {
	t.Helper()
	if err == nil {
		return false
	}
	require.ErrorIs(t, err, cuda.ErrNotSupported, "%s: an error other than ErrNotSupported", step)
	require.Contains(t, err.Error(), "IMEX", "%s: the error must name IMEX", step)
	t.Logf("fabric handles unavailable at %s (accepted): %v", step, err)
	return true
}

// TestGPUFabricExportImport (GPU): on a machine with IMEX, data written
// into a fabric-exportable allocation reads back through a buffer imported
// from its fabric chunks (sent as bytes); on one without (a single-node
// H200), every step that fails does so with ErrNotSupported naming IMEX.
// Either way device memory returns to its baseline.
func TestGPUFabricExportImport(t *testing.T) {
	d := cudatest.Device(t)
	require.NoError(t, d.Sync())
	before, _, err := d.MemInfo()
	require.NoError(t, err)
	defer func() {
		require.NoError(t, d.Sync())
		after, _, err := d.MemInfo()
		require.NoError(t, err)
		assert.InDelta(t, float64(before), float64(after), float64(8<<20), "device memory back to where it was")
	}()
	supported, err := d.FabricHandlesSupported()
	require.NoError(t, err)
	checkErr := d.CheckFabric()
	t.Logf("fabric attribute %v, CheckFabric: %v", supported, checkErr)
	if checkErr != nil {
		require.True(t, fabricUnavailable(t, "CheckFabric", checkErr))
	}
	src, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandleFabric})
	if fabricUnavailable(t, "virtual.New", err) {
		require.False(t, supported, "New refused fabric handles on a device whose attribute says yes")
		return
	}
	require.NoError(t, err)
	g := src.Granularity()
	b, err := src.Allocate(2*g, nil)
	if fabricUnavailable(t, "Allocate", err) {
		require.Error(t, checkErr, "Allocate refused fabric memory that CheckFabric could make")
		return
	}
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	want := cudatest.Pattern(int(2*g), 11)
	require.NoError(t, buffer.CopyFromHost(b, want, nil))
	chunks, err := src.ExportFabric(b)
	if fabricUnavailable(t, "ExportFabric", err) {
		require.Error(t, checkErr, "ExportFabric refused what CheckFabric could export")
		return
	}
	require.NoError(t, err)
	require.NoError(t, checkErr, "fabric export worked, so CheckFabric should have")
	var wire []byte
	for _, c := range chunks {
		enc, err := c.MarshalBinary()
		require.NoError(t, err)
		assert.NotContains(t, c.String(), string(c.Handle.Data[:16]))
		wire = append(wire, enc...)
	}
	got := make([]virtual.FabricChunk, len(chunks))
	for i := range got {
		require.NoError(t, got[i].UnmarshalBinary(wire[i*virtual.FabricChunkSize:(i+1)*virtual.FabricChunkSize]))
	}
	dst, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandleNone})
	require.NoError(t, err)
	ib, err := dst.ImportFabric(got, 2*g)
	if fabricUnavailable(t, "ImportFabric", err) {
		return
	}
	require.NoError(t, err)
	back := make([]byte, 2*g)
	require.NoError(t, buffer.CopyToHost(back, ib, nil))
	require.True(t, bytes.Equal(want, back), "the imported buffer holds other bytes than were written")
	require.NoError(t, ib.Close())
	// Garbage is refused cleanly.
	var junk cuda.MemFabricHandle
	copy(junk.Data[:], "no driver made these bytes")
	_, err = dst.ImportFabric([]virtual.FabricChunk{{Handle: junk, Size: g}}, g)
	require.Error(t, err)
	assert.Empty(t, dst.Live())
}

// TestGPUFabricGarbageImport (GPU): a fabric handle no driver made, given
// to the real driver, gives a clean error (ErrNotSupported naming IMEX
// without IMEX, a driver error with it), never a crash, and nothing stays
// imported.
func TestGPUFabricGarbageImport(t *testing.T) {
	d := cudatest.Device(t)
	var junk cuda.MemFabricHandle
	for i := range junk.Data {
		junk.Data[i] = byte(i*37 + 5)
	}
	h, err := d.MemImportFabric(&junk)
	if err == nil {
		_ = d.MemRelease(h)
		t.Fatal("the driver imported 64 bytes of garbage")
	}
	var oe *cuda.OpError
	require.True(t, errors.As(err, &oe), "%v", err)
	assert.Contains(t, err.Error(), "cuMemImportFromShareableHandle")
	if errors.Is(err, cuda.ErrNotSupported) {
		assert.Contains(t, err.Error(), "IMEX")
	}
	r, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandleNone})
	require.NoError(t, err)
	_, err = r.ImportFabric([]virtual.FabricChunk{{Handle: junk, Size: r.Granularity()}}, 1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "virtual.ImportFabric")
	assert.Empty(t, r.Live())
	require.NoError(t, r.Reclaim())
}

// TestGPUNCCLOptions (GPU): an allocation made with NCCLOptions has, as
// the driver reports it back, the properties ncclMemAlloc asks for: pinned
// device memory on the device, POSIX fd handles plus fabric exactly when
// CheckFabric passes, GPUDirect RDMA capable exactly when the device
// supports it with VMM, the recommended granularity, read-write access for
// the device (and a peer, on two GPUs); memory returns to its baseline.
func TestGPUNCCLOptions(t *testing.T) {
	d := cudatest.Device(t)
	require.NoError(t, d.Sync())
	before, _, err := d.MemInfo()
	require.NoError(t, err)
	var peers []*cuda.Device
	if all, err := cuda.Devices(); err == nil && len(all) > 1 {
		if ok, err := all[1].CanAccessPeer(d); err == nil && ok {
			peers = append(peers, all[1])
		}
	}
	o, err := virtual.NCCLOptions(d, peers...)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	f, err := d.Features()
	require.NoError(t, err)
	wantTypes := cuda.MemHandleTypePosixFileDescriptor
	if d.CheckFabric() == nil {
		wantTypes |= cuda.MemHandleTypeFabric
	}
	r, err := virtual.New(d, o)
	require.NoError(t, err)
	b, err := r.Allocate(3<<20+7, nil)
	require.NoError(t, err)
	p, err := r.AllocationProperties(b)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemAllocationTypePinned, p.Type)
	assert.Equal(t, cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())}, p.Location)
	assert.Equal(t, wantTypes, p.RequestedHandleTypes, "handle types")
	wantRDMA := uint8(0)
	if f.GPUDirectRDMAWithVMM {
		wantRDMA = 1
	}
	assert.Equal(t, wantRDMA, p.AllocFlags.GPUDirectRDMACapable, "gpuDirectRDMACapable")
	g, err := d.AllocationGranularity(&p, cuda.MemAllocationGranularityRecommended)
	require.NoError(t, err)
	assert.Equal(t, g, r.Granularity(), "the recommended granularity")
	for _, dd := range append([]*cuda.Device{d}, peers...) {
		acc, err := d.MemGetAccess(b.Ptr(), cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(dd.Ordinal())})
		require.NoError(t, err)
		assert.Equal(t, cuda.MemAccessProtReadWrite, acc, "access of %v", dd)
	}
	if wantTypes&cuda.MemHandleTypeFabric == 0 {
		_, err := r.ExportFabric(b)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "no fabric handle type, so no fabric export")
	}
	// Usable as an fd export too, as NCCL's IPC path needs.
	chunks, err := r.Export(b)
	require.NoError(t, err)
	require.NoError(t, virtual.CloseChunkFDs(chunks))
	require.NoError(t, b.Close())
	require.NoError(t, d.Sync())
	after, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.InDelta(t, float64(before), float64(after), float64(8<<20), "device memory back to where it was")
	assert.True(t, strings.Contains(cuda.FabricRequirements, "IMEX"))
}
