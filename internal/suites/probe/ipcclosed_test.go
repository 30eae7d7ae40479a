//go:build linux

package probe

import (
	"errors"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// TestIPCClosedEntryPoints: every export, import and re-export entry
// point answers an error matching cuda.ErrClosed for a closed DevicePool
// (fd and fabric handles), a closed PinnedPool, a closed ImportedPool
// (ExportBuffer of its Buffers, which outlive its Close, included: it
// used to make a descriptor), and a closed Handle, on the fake driver;
// the Buffers that outlived their pools still close, and the driver's
// counters return to their baseline.
func TestIPCClosedEntryPoints(t *testing.T) {
	withFabric(t, fakecuda.FabricWorks)
	d := dev(t, 0)
	check := baseline(t)
	fds := len(testutil.FDs(t))

	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	fpool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{Fabric: true})
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{IPC: true})
	if errors.Is(err, cuda.ErrNotSupported) {
		t.Logf("pinned IPC pools: %v", err)
		pinned = nil
	} else if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Allocate(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fpool.Allocate(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pb *buffer.Buffer
	if pinned != nil {
		if pb, err = pinned.Allocate(4096, nil); err != nil {
			t.Fatal(err)
		}
	}
	h, err := ipc.ExportPool(pool)
	if err != nil {
		t.Fatal(err)
	}
	imp, err := ipc.ImportPool(d, h)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := ipc.ExportBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := imp.Import(desc, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Every pool and the Handle closed; one Buffer of each lives on.
	for _, c := range []interface{ Close() error }{imp, pool, fpool, h} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if pinned != nil {
		if err := pinned.Close(); err != nil {
			t.Fatal(err)
		}
	}

	entries := map[string]func() error{
		"ExportPool(closed DevicePool)":             func() error { _, err := ipc.ExportPool(pool); return err },
		"ExportPoolFabric(closed DevicePool)":       func() error { _, err := ipc.ExportPoolFabric(fpool); return err },
		"ExportBuffer(buffer of closed DevicePool)": func() error { _, err := ipc.ExportBuffer(b); return err },
		"ExportBuffer(buffer of closed fabric)":     func() error { _, err := ipc.ExportBuffer(fb); return err },
		"ExportBuffer(buffer of closed import)":     func() error { _, err := ipc.ExportBuffer(ib); return err },
		"ExportPool(closed ImportedPool)":           func() error { _, err := ipc.ExportPool(imp); return err },
		"ExportPoolFabric(closed ImportedPool)":     func() error { _, err := ipc.ExportPoolFabric(imp); return err },
		"ImportedPool.Import":                       func() error { _, err := imp.Import(desc, nil); return err },
		"ImportedPool.ImportUnauthenticated":        func() error { _, err := imp.ImportUnauthenticated(desc.ExportData(), desc.Size, nil); return err },
		"ImportPool(closed Handle)":                 func() error { _, err := ipc.ImportPool(d, h); return err },
		"Handle.ExtraFile(closed)":                  func() error { _, err := h.ExtraFile(); return err },
	}
	if pinned != nil {
		entries["ExportPool(closed PinnedPool)"] = func() error { _, err := ipc.ExportPool(pinned); return err }
		entries["ExportBuffer(buffer of closed PinnedPool)"] = func() error { _, err := ipc.ExportBuffer(pb); return err }
	}
	for name, call := range entries {
		err := call()
		if !errors.Is(err, cuda.ErrClosed) {
			t.Errorf("%s: %v, want an error matching cuda.ErrClosed", name, err)
		}
	}
	closeAll(t, ib, b, fb, pb)
	if got := len(testutil.FDs(t)); got != fds {
		t.Errorf("fds %d, before %d", got, fds)
	}
	check()
}
