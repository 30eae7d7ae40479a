package virtual

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// TestFabricExportImport: an allocation of two physical chunks exports as
// two fabric chunks that survive encoding and import into another resource
// as one buffer; closing both gives every driver resource back.
func TestFabricExportImport(t *testing.T) {
	f := newFake(testGran)
	src, err := newResource(f, fakeDevice, &Options{HandleType: HandleFabric, Reserve: 4 * testGran})
	require.NoError(t, err)
	dst, err := newResource(f, fakeDevice, &Options{HandleType: HandleNone})
	require.NoError(t, err)
	b, err := src.Allocate(testGran, nil)
	require.NoError(t, err)
	b, err = src.Grow(b, 2*testGran) // a second physical chunk
	require.NoError(t, err)
	chunks, err := src.ExportFabric(b)
	require.NoError(t, err)
	require.Len(t, chunks, 2)
	var wire [][]byte
	for _, c := range chunks {
		assert.Equal(t, uint64(testGran), c.Size)
		enc, err := c.MarshalBinary()
		require.NoError(t, err)
		require.Len(t, enc, FabricChunkSize)
		wire = append(wire, enc)
		assert.NotContains(t, c.String(), string(c.Handle.Data[:8]), "String dumps the handle")
	}
	got := make([]FabricChunk, len(wire))
	for i, enc := range wire {
		require.NoError(t, got[i].UnmarshalBinary(enc))
	}
	require.Equal(t, chunks, got)
	ib, err := dst.ImportFabric(got, 2*testGran-5)
	require.NoError(t, err)
	assert.Equal(t, uint64(2*testGran-5), ib.Size())
	f.requireSane(t) // two resources share the fake: checkInvariants is for one
	require.NoError(t, ib.Close())
	require.NoError(t, b.Close())
	f.requireEmpty(t)
}

func TestFabricExportRefused(t *testing.T) {
	r, f := newFakeResource(t, testGran, &Options{HandleType: HandleNone})
	b, err := r.Allocate(testGran, nil)
	require.NoError(t, err)
	_, err = r.ExportFabric(b)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "HandleFabric")
	_, err = r.ExportFabric(nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.NoError(t, b.Close())
	_, err = r.ExportFabric(b)
	require.ErrorIs(t, err, cuda.ErrClosed)
	f.requireEmpty(t)
}

// TestFabricNoIMEX: with the device claiming support but the driver
// refusing (no IMEX), export and import fail with ErrNotSupported that
// names IMEX and keeps the driver's Result; nothing is left behind.
func TestFabricNoIMEX(t *testing.T) {
	for _, res := range []cuda.Result{cuda.ErrorNotPermitted, cuda.ErrorNotSupported} {
		f := newFake(testGran)
		r, err := newResource(f, fakeDevice, &Options{HandleType: HandleFabric})
		require.NoError(t, err)
		b, err := r.Allocate(testGran, nil)
		require.NoError(t, err)
		f.fab.refuse = res
		_, err = r.ExportFabric(b)
		requireIMEX(t, err, res)
		var fh cuda.MemFabricHandle
		fh.Data[0] = 1
		_, err = r.ImportFabric([]FabricChunk{{Handle: fh, Size: testGran}}, testGran)
		requireIMEX(t, err, res)
		require.NoError(t, b.Close())
		f.requireEmpty(t)
	}
	f := newFake(testGran)
	f.fab.noAttr = true
	_, err := newResource(f, fakeDevice, &Options{HandleType: HandleFabric})
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "IMEX")
}

func requireIMEX(t *testing.T, err error, res cuda.Result) {
	t.Helper()
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	require.ErrorIs(t, err, res)
	assert.Contains(t, err.Error(), "IMEX")
	assert.Contains(t, err.Error(), "nvidia-imex")
}

// TestFabricImportHostile: lists the checks refuse never reach the
// driver; handles the driver does not know fail cleanly; nothing is left.
func TestFabricImportHostile(t *testing.T) {
	r, f := newFakeResource(t, testGran, nil)
	var fh cuda.MemFabricHandle
	copy(fh.Data[:], "garbage, not an export")
	calls := f.calls
	for name, tc := range map[string]struct {
		chunks []FabricChunk
		size   uint64
	}{
		"none":         {nil, testGran},
		"zero handle":  {[]FabricChunk{{Size: testGran}}, testGran},
		"zero size":    {[]FabricChunk{{Handle: fh}}, 1},
		"off granule":  {[]FabricChunk{{Handle: fh, Size: testGran + 1}}, 1},
		"size too big": {[]FabricChunk{{Handle: fh, Size: testGran}}, testGran + 1},
		"size 0":       {[]FabricChunk{{Handle: fh, Size: testGran}}, 0},
		"total wraps":  {[]FabricChunk{{Handle: fh, Size: 1 << 63}, {Handle: fh, Size: 1 << 63}}, 1},
	} {
		_, err := r.ImportFabric(tc.chunks, tc.size)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		assert.Contains(t, err.Error(), "virtual.ImportFabric", name)
	}
	assert.Equal(t, calls, f.calls, "the driver was called: %v", f.log)
	_, err := r.ImportFabric([]FabricChunk{{Handle: fh, Size: testGran}}, testGran)
	require.ErrorIs(t, err, cuda.ErrorInvalidValue)
	assert.Contains(t, err.Error(), "virtual.ImportFabric chunk 0")
	require.NoError(t, r.Reclaim())
	f.requireEmpty(t)
}

// TestFaultSweepFabricImport fails each driver call of a two-chunk fabric
// import in turn: it fails naming the driver's error and leaves nothing
// reserved, imported or mapped; the resource still works.
func TestFaultSweepFabricImport(t *testing.T) {
	setup := func() (*Resource, *fakeDriver, *Resource, []FabricChunk) {
		f := newFake(testGran)
		src, err := newResource(f, fakeDevice, &Options{HandleType: HandleFabric, Reserve: 2 * testGran})
		require.NoError(t, err)
		b, err := src.Allocate(testGran, nil)
		require.NoError(t, err)
		b, err = src.Grow(b, 2*testGran)
		require.NoError(t, err)
		chunks, err := src.ExportFabric(b)
		require.NoError(t, err)
		dst, err := newResource(f, fakeDevice, &Options{HandleType: HandleNone})
		require.NoError(t, err)
		return src, f, dst, chunks
	}
	_, f, dst, chunks := setup()
	before := f.calls
	nb, err := dst.ImportFabric(chunks, 2*testGran)
	require.NoError(t, err)
	n := f.calls - before
	require.NoError(t, nb.Close())
	for k := 1; k <= n; k++ {
		for _, sticky := range []bool{false, true} {
			_, f, dst, chunks := setup()
			live := len(f.handles)
			f.failAt(k, sticky)
			nb, err := dst.ImportFabric(chunks, 2*testGran)
			f.heal()
			if err == nil {
				require.NoError(t, nb.Close())
			} else {
				require.ErrorIs(t, err, cuda.ErrorUnknown, "k=%d", k)
				require.Contains(t, err.Error(), "virtual.ImportFabric")
			}
			require.NoError(t, dst.Reclaim(), "k=%d sticky=%v", k, sticky)
			f.requireSane(t)
			dst.mu.Lock()
			require.Empty(t, dst.allocs, "k=%d sticky=%v", k, sticky)
			dst.mu.Unlock()
			require.Len(t, f.maps, 2, "k=%d sticky=%v: only the source's mappings may remain", k, sticky)
			require.Len(t, f.resv, 1, "k=%d sticky=%v: only the source's reservation may remain", k, sticky)
			require.Len(t, f.handles, live, "k=%d sticky=%v: imported handles left", k, sticky)
			nb, err = dst.ImportFabric(chunks, 2*testGran)
			require.NoError(t, err, "k=%d: the resource must still work", k)
			require.NoError(t, nb.Close())
		}
	}
}

func TestFabricChunkEncoding(t *testing.T) {
	var c FabricChunk
	c.Size = 3 * testGran
	for i := range c.Handle.Data {
		c.Handle.Data[i] = byte(i + 1)
	}
	enc, err := c.MarshalBinary()
	require.NoError(t, err)
	for i := range enc {
		bad := append([]byte(nil), enc...)
		bad[i] ^= 0x40
		var d FabricChunk
		err := d.UnmarshalBinary(bad)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "byte %d flipped", i)
		require.Equal(t, FabricChunk{}, d)
	}
	for _, n := range []int{0, 1, FabricChunkSize - 1, FabricChunkSize + 1} {
		var d FabricChunk
		require.ErrorIs(t, d.UnmarshalBinary(make([]byte, n)), cuda.ErrInvalidArgument)
	}
	_, err = FabricChunk{Size: 1}.MarshalBinary()
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = FabricChunk{Handle: c.Handle}.MarshalBinary()
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	var nilc *FabricChunk
	require.ErrorIs(t, nilc.UnmarshalBinary(enc), cuda.ErrInvalidArgument)
}

func FuzzFabricChunkUnmarshal(f *testing.F) {
	var c FabricChunk
	c.Size, c.Handle.Data[5] = testGran, 9
	enc, _ := c.MarshalBinary()
	f.Add(enc)
	f.Add([]byte("cudamemF"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d FabricChunk
		if err := d.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, cuda.ErrInvalidArgument) || d != (FabricChunk{}) {
				t.Fatalf("%v (chunk %v)", err, d)
			}
			return
		}
		out, err := d.MarshalBinary()
		if err != nil || string(out) != string(b) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// TestNCCLOptions: the options are ncclMemAlloc's, with fabric handles
// only where they work, and the probe leaves nothing behind.
func TestNCCLOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		goos   string
		setup  func(f *fakeDriver)
		handle HandleType
	}{
		{"fabric works", "linux", func(f *fakeDriver) {}, HandlePosixFDAndFabric},
		{"no IMEX", "linux", func(f *fakeDriver) { f.fab.refuse = cuda.ErrorNotPermitted }, HandlePosixFD},
		{"not supported", "linux", func(f *fakeDriver) { f.fab.refuse = cuda.ErrorNotSupported }, HandlePosixFD},
		{"no fabric attribute", "linux", func(f *fakeDriver) { f.fab.noAttr = true }, HandlePosixFD},
		{"no POSIX fds", "linux", func(f *fakeDriver) { f.feats.PosixFDHandles = false; f.fab.noAttr = true }, HandleNone},
		{"windows, fabric", "windows", func(f *fakeDriver) {}, HandleFabric},
		{"windows, none", "windows", func(f *fakeDriver) { f.fab.refuse = cuda.ErrorNotPermitted }, HandleNone},
		{"no RDMA", "linux", func(f *fakeDriver) { f.feats.GPUDirectRDMAWithVMM = false }, HandlePosixFDAndFabric},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(testGran)
			tc.setup(f)
			o, err := ncclOptions(f, fakeDevice, tc.goos, []*cuda.Device{fakePeer1})
			require.NoError(t, err)
			assert.Equal(t, tc.handle, o.HandleType)
			assert.Equal(t, f.feats.GPUDirectRDMAWithVMM, o.GPUDirectRDMA)
			assert.Equal(t, Recommended, o.Granularity)
			assert.Equal(t, OnDevice, o.Location)
			assert.Equal(t, Pinned, o.AllocationType)
			assert.Equal(t, []*cuda.Device{fakePeer1}, o.Peers)
			assert.Equal(t, ReadWrite, o.PeerAccess)
			f.requireEmpty(t)
		})
	}
	f := newFake(testGran)
	f.failCall("cuMemCreate", 1, false)
	_, err := ncclOptions(f, fakeDevice, "linux", nil)
	require.ErrorIs(t, err, cuda.ErrorUnknown, "an error other than a fabric refusal is returned")
	f.requireEmpty(t)
	f = newFake(testGran)
	f.feats.VirtualMemory = false
	_, err = ncclOptions(f, fakeDevice, "linux", nil)
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	_, err = ncclOptions(newFake(testGran), fakeDevice, "linux", []*cuda.Device{fakeDevice})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = NCCLOptions(nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// TestNCCLAllocationProperties allocates with NCCLOptions and reads the
// properties back from the driver: they are what ncclMemAlloc asks for.
func TestNCCLAllocationProperties(t *testing.T) {
	f := newFake(testGran)
	o, err := ncclOptions(f, fakeDevice, "linux", []*cuda.Device{fakePeer1})
	require.NoError(t, err)
	r, err := newResource(f, fakeDevice, o)
	require.NoError(t, err)
	b, err := r.Allocate(3*testGran+1, nil)
	require.NoError(t, err)
	p, err := r.AllocationProperties(b)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemAllocationTypePinned, p.Type)
	assert.Equal(t, cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 0}, p.Location)
	assert.Equal(t, cuda.MemHandleTypePosixFileDescriptor|cuda.MemHandleTypeFabric, p.RequestedHandleTypes)
	assert.Equal(t, uint8(1), p.AllocFlags.GPUDirectRDMACapable)
	assert.Equal(t, uint64(testGran), r.Granularity())
	for _, loc := range []cuda.MemLocation{{Type: cuda.MemLocationTypeDevice, ID: 0}, {Type: cuda.MemLocationTypeDevice, ID: 1}} {
		acc, err := f.MemGetAccess(b.Ptr(), loc)
		require.NoError(t, err)
		assert.Equal(t, cuda.MemAccessProtReadWrite, acc, "device %d", loc.ID)
	}
	require.NoError(t, b.Close())
	_, err = r.AllocationProperties(b)
	require.Error(t, err)
	f.requireEmpty(t)
	require.Empty(t, f.fab.retains[0])
	for h, n := range f.fab.retains {
		require.Zero(t, n, "handle %#x still retained", uint64(h))
	}
}

// TestFabricImportWrongLocation: where imported memory lives is read from
// the driver: device memory is refused by a host-located resource.
func TestFabricImportWrongLocation(t *testing.T) {
	f := newFake(testGran)
	src, err := newResource(f, fakeDevice, &Options{HandleType: HandleFabric})
	require.NoError(t, err)
	host, err := newResource(f, fakeDevice, &Options{HandleType: HandleNone, Location: OnHost})
	require.NoError(t, err)
	b, err := src.Allocate(testGran, nil)
	require.NoError(t, err)
	chunks, err := src.ExportFabric(b)
	require.NoError(t, err)
	_, err = host.ImportFabric(chunks, testGran)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "Location")
	require.NoError(t, b.Close())
	require.NoError(t, host.Reclaim())
	f.requireEmpty(t)
}
