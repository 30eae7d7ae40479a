//go:build linux

package probe

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/virtual"
)

// withFabric runs the test with the fake in mode m, restoring the mode
// after.
func withFabric(t *testing.T, m fakecuda.FabricMode) {
	t.Helper()
	old := fake.SetFabric(m)
	t.Cleanup(func() { fake.SetFabric(old) })
}

func wantIMEX(t *testing.T, what string, err error, res cuda.Result) {
	t.Helper()
	if !errors.Is(err, cuda.ErrNotSupported) || !errors.Is(err, res) || !strings.Contains(err.Error(), "IMEX") {
		t.Fatalf("%s: %v: want ErrNotSupported and %v, naming IMEX", what, err, res)
	}
}

// TestFabricVirtualRoundTrip: data written through one resource's buffer
// reads back through a buffer imported from its fabric chunks (sent as
// bytes), and every counter returns to its baseline.
func TestFabricVirtualRoundTrip(t *testing.T) {
	withFabric(t, fakecuda.FabricWorks)
	warmStaging(t, 4<<20)
	check := baseline(t)
	src := newVirtual(t, &virtual.Options{HandleType: virtual.HandleFabric, Reserve: 64 << 20})
	dst := newVirtual(t, &virtual.Options{HandleType: virtual.HandleNone})
	g := src.Granularity()
	b, err := src.Allocate(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err = src.Grow(b, 2*g); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 2*g)
	for i := range want {
		want[i] = byte(i*13 + 7)
	}
	if err := buffer.CopyFromHost(b, want, nil); err != nil {
		t.Fatal(err)
	}
	chunks, err := src.ExportFabric(b)
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	for _, c := range chunks {
		enc, err := c.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		wire = append(wire, enc...)
	}
	got := make([]virtual.FabricChunk, len(wire)/virtual.FabricChunkSize)
	for i := range got {
		if err := got[i].UnmarshalBinary(wire[i*virtual.FabricChunkSize : (i+1)*virtual.FabricChunkSize]); err != nil {
			t.Fatal(err)
		}
	}
	ib, err := dst.ImportFabric(got, 2*g)
	if err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 2*g)
	if err := buffer.CopyToHost(back, ib, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, want) {
		t.Fatal("imported memory holds other bytes than were written")
	}
	// The importer's writes reach the exporter: one physical memory.
	back[0] = 0xee
	if err := buffer.CopyFromHost(ib, back, nil); err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 2*g)
	if err := buffer.CopyToHost(one, b, nil); err != nil {
		t.Fatal(err)
	}
	if one[0] != 0xee {
		t.Fatalf("exporter reads %#x after the importer wrote 0xee", one[0])
	}
	closeAll(t, ib, b)
	check()
}

// warmStaging makes host copies of n bytes once, so the pinned staging
// buffers they keep for later copies exist before a baseline is taken.
func warmStaging(t *testing.T, n uint64) {
	t.Helper()
	r := newVirtual(t, &virtual.Options{HandleType: virtual.HandleNone})
	b, err := r.Allocate(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	host := make([]byte, n)
	if err := buffer.CopyFromHost(b, host, nil); err != nil {
		t.Fatal(err)
	}
	if err := buffer.CopyToHost(host, b, nil); err != nil {
		t.Fatal(err)
	}
	closeAll(t, b)
}

// TestFabricHostileImport: garbage, stale handles and a size larger than
// the exported memory are refused cleanly by the driver, leaving nothing
// behind.
func TestFabricHostileImport(t *testing.T) {
	withFabric(t, fakecuda.FabricWorks)
	check := baseline(t)
	d := dev(t, 0)
	src := newVirtual(t, &virtual.Options{HandleType: virtual.HandleFabric})
	dst := newVirtual(t, &virtual.Options{HandleType: virtual.HandleNone})
	g := src.Granularity()
	var garbage cuda.MemFabricHandle
	copy(garbage.Data[:], "not a handle the driver made, though 64 bytes long")
	noPanic(t, "garbage", func() {
		_, err := dst.ImportFabric([]virtual.FabricChunk{{Handle: garbage, Size: g}}, g)
		wantErr(t, "garbage import", err, "virtual.ImportFabric")
		_, err = d.MemImportFabric(&garbage)
		wantErr(t, "garbage MemImportFabric", err, "cuMemImportFromShareableHandle")
		_, err = d.ImportMemPoolFabric(&garbage)
		wantErr(t, "garbage ImportMemPoolFabric", err, "cuMemPoolImportFromShareableHandle")
	})
	b, err := src.Allocate(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := src.ExportFabric(b)
	if err != nil {
		t.Fatal(err)
	}
	// Claiming twice the exported memory: the driver maps no more than it
	// holds.
	big := []virtual.FabricChunk{{Handle: chunks[0].Handle, Size: 2 * g}}
	if ib, err := dst.ImportFabric(big, 2*g); err == nil {
		ib.Close()
		t.Fatal("import of 2 granules from a 1-granule export worked")
	} else {
		wantErr(t, "oversized import", err, "virtual.ImportFabric")
	}
	// A memory handle is not a pool handle.
	if _, err := d.ImportMemPoolFabric(&chunks[0].Handle); err == nil {
		t.Fatal("a memory fabric handle imported as a pool")
	}
	h, err := d.MemImportFabric(&chunks[0].Handle)
	if err != nil {
		t.Fatalf("a real handle: %v", err)
	}
	if err := d.MemRelease(h); err != nil {
		t.Fatal(err)
	}
	closeAll(t, b)
	// Stale: the exporter's memory is gone.
	if ib, err := dst.ImportFabric(chunks, g); err == nil {
		ib.Close()
		t.Fatal("import of a freed allocation's handle worked")
	}
	if err := dst.Reclaim(); err != nil {
		t.Fatal(err)
	}
	check()
}

// TestFabricNoIMEX: where the device reports fabric support but IMEX is
// absent (as on a single-node H200), and where it reports none, every
// fabric path fails with ErrNotSupported naming IMEX, keeping the driver's
// Result, and leaves nothing behind; NCCLOptions falls back to POSIX fds.
func TestFabricNoIMEX(t *testing.T) {
	for _, tc := range []struct {
		mode fakecuda.FabricMode
		res  cuda.Result
	}{{fakecuda.FabricNoIMEX, cuda.ErrorNotPermitted}, {fakecuda.FabricUnsupported, cuda.ErrorNotSupported}} {
		withFabric(t, tc.mode)
		check := baseline(t)
		d := dev(t, 0)
		err := d.CheckFabric()
		if !errors.Is(err, cuda.ErrNotSupported) || !strings.Contains(err.Error(), "IMEX") {
			t.Fatalf("mode %d: CheckFabric: %v", tc.mode, err)
		}
		r, err := virtual.New(d, &virtual.Options{HandleType: virtual.HandleFabric})
		if tc.mode == fakecuda.FabricUnsupported {
			if !errors.Is(err, cuda.ErrNotSupported) || !strings.Contains(err.Error(), "IMEX") {
				t.Fatalf("New without fabric support: %v", err)
			}
		} else {
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.Allocate(r.Granularity(), nil)
			wantIMEX(t, "Allocate", err, tc.res)
		}
		var fh cuda.MemFabricHandle
		fh.Data[3] = 1
		_, err = d.MemImportFabric(&fh)
		wantIMEX(t, "MemImportFabric", err, tc.res)
		_, err = d.ImportMemPoolFabric(&fh)
		wantIMEX(t, "ImportMemPoolFabric", err, tc.res)
		// Every location type: without IMEX the driver makes such a pool
		// and crashes when it is destroyed, host pools as device ones.
		for _, loc := range []cuda.MemLocation{{Type: cuda.MemLocationTypeDevice}, {Type: cuda.MemLocationTypeHost},
			{Type: cuda.MemLocationTypeHostNUMA}, {Type: cuda.MemLocationTypeHostNUMACurrent}} {
			_, err = d.CreateMemPool(&cuda.MemPoolProps{AllocType: cuda.MemAllocationTypePinned, HandleTypes: cuda.MemHandleTypeFabric,
				Location: loc})
			wantIMEX(t, "CreateMemPool", err, tc.res)
		}
		o, err := virtual.NCCLOptions(d)
		if err != nil {
			t.Fatal(err)
		}
		if o.HandleType != virtual.HandlePosixFD {
			t.Fatalf("NCCLOptions without IMEX: handle type %d, want HandlePosixFD", o.HandleType)
		}
		check()
	}
}

// TestNCCLOptionsProperties allocates with NCCLOptions on the fake driver
// and reads back what the driver made (cuMemRetainAllocationHandle and
// cuMemGetAllocationPropertiesFromHandle): ncclMemAlloc's properties, with
// fabric handles exactly when they work.
func TestNCCLOptionsProperties(t *testing.T) {
	for _, m := range []fakecuda.FabricMode{fakecuda.FabricWorks, fakecuda.FabricNoIMEX} {
		withFabric(t, m)
		check := baseline(t)
		d0, d1 := dev(t, 0), dev(t, 1)
		o, err := virtual.NCCLOptions(d0, d1)
		if err != nil {
			t.Fatal(err)
		}
		r := newVirtual(t, o)
		b, err := r.Allocate(3<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := r.AllocationProperties(b)
		if err != nil {
			t.Fatal(err)
		}
		want := cuda.MemHandleTypePosixFileDescriptor
		if m == fakecuda.FabricWorks {
			want |= cuda.MemHandleTypeFabric
		}
		if p.Type != cuda.MemAllocationTypePinned || p.Location != (cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: 0}) ||
			p.RequestedHandleTypes != want || p.AllocFlags.GPUDirectRDMACapable != 1 {
			t.Errorf("mode %d: properties %+v; want pinned on device 0, handle types %#x, GPUDirect RDMA", m, p, want)
		}
		g, err := d0.AllocationGranularity(&p, cuda.MemAllocationGranularityRecommended)
		if err != nil || g != r.Granularity() {
			t.Errorf("granularity %d, want the recommended %d (%v)", r.Granularity(), g, err)
		}
		for _, dd := range []*cuda.Device{d0, d1} {
			acc, err := d0.MemGetAccess(b.Ptr(), cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(dd.Ordinal())})
			if err != nil || acc != cuda.MemAccessProtReadWrite {
				t.Errorf("access of %v: %v, %v", dd, acc, err)
			}
		}
		closeAll(t, b)
		check()
	}
}
