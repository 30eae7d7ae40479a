//go:build linux

package probe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// TestFabricPoolRoundTrip: a pool made with fabric handles exports as a
// FabricHandle that survives encoding, imports (once per UUID, as
// ImportPool does), and its buffers' descriptors import with the data
// intact; a fabric-only pool refuses ExportPool; everything returns to its
// baseline.
func TestFabricPoolRoundTrip(t *testing.T) {
	withFabric(t, fakecuda.FabricWorks)
	warmStaging(t, 1<<20)
	d := dev(t, 0)
	check := baseline(t)
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{Fabric: true})
	if err != nil {
		t.Fatal(err)
	}
	if pool.HandleTypes() != cuda.MemHandleTypeFabric || !pool.IsIPCEnabled() {
		t.Fatalf("handle types %#x, IPC-enabled %v", pool.HandleTypes(), pool.IsIPCEnabled())
	}
	if _, err := ipc.ExportPool(pool); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("ExportPool of a fabric-only pool: %v", err)
	}
	b, err := pool.Allocate(1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i*31 + 3)
	}
	if err := buffer.CopyFromHost(b, want, nil); err != nil {
		t.Fatal(err)
	}
	// The descriptor first: the pool is exported once for it.
	desc, err := ipc.ExportBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	fh, err := ipc.ExportPoolFabric(pool)
	if err != nil {
		t.Fatal(err)
	}
	if !fh.HasKey() || strings.Contains(fh.String(), "key true") == false {
		t.Errorf("handle %v: want a key", fh)
	}
	wire, err := fh.MarshalBinary()
	if err != nil || len(wire) != ipc.FabricHandleSize {
		t.Fatalf("MarshalBinary: %d bytes, %v", len(wire), err)
	}
	var got ipc.FabricHandle
	if err := got.UnmarshalBinary(wire); err != nil {
		t.Fatal(err)
	}
	imp, err := ipc.ImportPoolFabric(d, &got)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ipc.ImportPoolFabric(d, &got)
	if err != nil || again != imp {
		t.Fatalf("second import: %v, %v (want the same pool)", again, err)
	}
	if _, err := ipc.ExportPool(imp); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("fd re-export of a fabric import: %v", err)
	}
	re, err := ipc.ExportPoolFabric(imp)
	if err != nil || re.UUID() != fh.UUID() || re.Fabric() != fh.Fabric() {
		t.Fatalf("re-export: %v, %v", re, err)
	}
	ib, err := imp.Import(desc, nil)
	if err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(want))
	if err := buffer.CopyToHost(back, ib, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, want) {
		t.Fatal("imported buffer holds other bytes")
	}
	closeAll(t, ib, b)
	if err := imp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	check()
}

// craftFabric encodes a FabricHandle of the given UUID and driver bytes,
// without a key, with a valid checksum: what a peer that knows the
// format could send.
func craftFabric(t *testing.T, uuid ipc.UUID, driver []byte) *ipc.FabricHandle {
	t.Helper()
	b := make([]byte, ipc.FabricHandleSize)
	copy(b, "cudamemP")
	binary.LittleEndian.PutUint16(b[8:], 1)
	copy(b[12:28], uuid[:])
	copy(b[28+32:], driver)
	binary.LittleEndian.PutUint32(b[ipc.FabricHandleSize-4:], crc32.ChecksumIEEE(b[:ipc.FabricHandleSize-4]))
	var h ipc.FabricHandle
	if err := h.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	return &h
}

// TestFabricPoolHostile: well-formed encodings of garbage handles, a
// handle under a known UUID with another key, and corrupted bytes are all
// refused cleanly; nothing is imported or registered.
func TestFabricPoolHostile(t *testing.T) {
	withFabric(t, fakecuda.FabricWorks)
	d := dev(t, 0)
	check := baseline(t)
	u := cuda.NewUUID()
	junk := craftFabric(t, u, []byte("sixty-four bytes of nothing the driver ever made......"))
	noPanic(t, "junk", func() {
		_, err := ipc.ImportPoolFabric(d, junk)
		wantErr(t, "junk pool handle", err, "ipc.ImportPoolFabric")
	})
	if _, ok := ipc.Lookup(u); ok {
		t.Fatal("a refused import is registered")
	}
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{Fabric: true, IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	fh, err := ipc.ExportPoolFabric(pool)
	if err != nil {
		t.Fatal(err)
	}
	imp, err := ipc.ImportPoolFabric(d, fh)
	if err != nil {
		t.Fatal(err)
	}
	// The real handle under the same UUID but without the key: refused,
	// the key descriptors are checked with cannot be swapped.
	drv := fh.Fabric()
	if _, err := ipc.ImportPoolFabric(d, craftFabric(t, fh.UUID(), drv.Data[:])); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("same UUID, no key: %v", err)
	}
	wire, _ := fh.MarshalBinary()
	for i := range wire {
		bad := append([]byte(nil), wire...)
		bad[i] ^= 0x20
		var h ipc.FabricHandle
		if err := h.UnmarshalBinary(bad); !errors.Is(err, ipc.ErrBadFabricHandle) || h.UUID() != (ipc.UUID{}) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	for _, n := range []int{0, 1, ipc.FabricHandleSize - 1, ipc.FabricHandleSize + 1} {
		var h ipc.FabricHandle
		if err := h.UnmarshalBinary(make([]byte, n)); !errors.Is(err, cuda.ErrInvalidArgument) {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
	var zero ipc.FabricHandle
	if _, err := ipc.ImportPoolFabric(d, &zero); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("zero handle: %v", err)
	}
	if _, err := ipc.ImportPoolFabric(nil, fh); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("nil device: %v", err)
	}
	if _, err := zero.MarshalBinary(); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("zero MarshalBinary: %v", err)
	}
	// A pool without fabric handles.
	plain, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ipc.ExportPoolFabric(plain); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("ExportPoolFabric of an fd-only pool: %v", err)
	}
	for _, c := range []interface{ Close() error }{imp, pool, plain} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	check()
}

// TestFabricPoolNoIMEX: without IMEX a fabric pool cannot be made, and the
// error says why.
func TestFabricPoolNoIMEX(t *testing.T) {
	withFabric(t, fakecuda.FabricNoIMEX)
	check := baseline(t)
	_, err := resource.NewDevicePool(dev(t, 0), &resource.DevicePoolOptions{Fabric: true})
	wantIMEX(t, "NewDevicePool(Fabric)", err, cuda.ErrorNotPermitted)
	fake.SetFabric(fakecuda.FabricUnsupported)
	_, err = resource.NewDevicePool(dev(t, 0), &resource.DevicePoolOptions{Fabric: true})
	if !errors.Is(err, cuda.ErrNotSupported) || !strings.Contains(err.Error(), "IMEX") {
		t.Errorf("NewDevicePool(Fabric) on a device without fabric pools: %v", err)
	}
	check()
}
