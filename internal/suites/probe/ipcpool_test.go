//go:build linux

package probe

import (
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

func TestImportStreams(t *testing.T) {
	d0, d1 := dev(t, 0), dev(t, 1)
	check := baseline(t)
	pool, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ipc.ExportPool(pool)
	if err != nil {
		t.Fatal(err)
	}
	imp, err := ipc.ImportPool(d0, h)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Allocate(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := ipc.ExportBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	closed, _ := d0.NewStream()
	closed.Close()
	for name, s := range map[string]*cuda.Stream{"zero": new(cuda.Stream), "closed": closed, "dev1": d1.DefaultStream()} {
		ib, err := imp.Import(desc, s)
		if err != nil {
			wantErr(t, name, err, "ImportedPool.Import")
			t.Logf("%s: %v", name, err)
			continue
		}
		t.Errorf("Import on %s stream: no error", name)
		if err := ib.Close(); err != nil {
			t.Errorf("  then Close: %v", err)
			if err := ib.CloseOn(d0.DefaultStream()); err != nil {
				t.Errorf("  CloseOn default: %v", err)
			}
		}
	}
	// Import from device 1 of a pool imported on device 0
	if _, err := ipc.ImportPool(d1, h); err == nil {
		t.Errorf("ImportPool on another device: no error")
	}
	// ExportBuffer of a view, closed, zero
	v, _ := b.Slice(256, 256)
	if _, err := ipc.ExportBuffer(v); err == nil {
		t.Errorf("ExportBuffer(view): no error")
	}
	// descriptor with wrong pool
	d2 := desc
	d2.Size = 1 << 63
	if _, err := imp.Import(d2, nil); err == nil {
		t.Errorf("Import altered: no error")
	}
	if _, err := imp.ImportUnauthenticated(d2.ExportData(), d2.Size, nil); err == nil {
		t.Errorf("ImportUnauthenticated oversized: no error")
	} else {
		wantErr(t, "oversize", err, "ImportedPool.ImportUnauthenticated")
	}
	b.Close()
	imp.Close()
	h.Close()
	pool.Close()
	check()
}

// A refused import unmaps on the stream given: a zero stream leaves the
// mapping behind.
func TestImportRefusedZeroStreamLeaks(t *testing.T) {
	d0 := dev(t, 0)
	pool, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h, err := ipc.ExportPool(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	imp, err := ipc.ImportPool(d0, h)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Close()
	b, err := pool.Allocate(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	desc, err := ipc.ExportBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	desc.Size = 1 << 20 // more than the mapping: refused after the driver mapped it
	check := baseline(t)
	_, err = imp.ImportUnauthenticated(desc.ExportData(), desc.Size, new(cuda.Stream))
	wantErr(t, "oversized on zero stream", err, "ImportedPool.ImportUnauthenticated")
	t.Log(err)
	check()
}
