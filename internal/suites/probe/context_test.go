//go:build linux

package probe

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// Resources, copies and fills through a view of a context made with
// Device.NewContext, on the fake driver: data read back, every counter
// back to its baseline once the context is closed.
func TestContextViewResources(t *testing.T) {
	defer baseline(t)()
	d0, d1 := dev(t, 0), dev(t, 1)
	c, err := d0.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	v := c.Device()
	s, err := v.NewStream()
	if err != nil {
		t.Fatal(err)
	}

	current, err := resource.CurrentDevicePool(v)
	if err != nil {
		t.Fatalf("CurrentDevicePool(view): %v", err)
	}
	owned, err := resource.NewDevicePool(v, nil)
	if err != nil {
		t.Fatalf("NewDevicePool(view): %v", err)
	}
	sync, err := resource.NewSyncDevice(v)
	if err != nil {
		t.Fatalf("NewSyncDevice(view): %v", err)
	}
	def, err := resource.Default(v)
	if err != nil {
		t.Fatalf("Default(view): %v", err)
	}
	vm, err := virtual.New(v, nil)
	if err != nil {
		t.Fatalf("virtual.New(view): %v", err)
	}
	src := bytes.Repeat([]byte("context view "), 100)
	for name, mr := range map[string]buffer.MemoryResource{"current": current, "owned": owned, "sync": sync, "default": def, "virtual": vm} {
		b, err := buffer.Allocate(mr, uint64(len(src)+3), s)
		if err != nil {
			t.Fatalf("%s: Allocate: %v", name, err)
		}
		if err := b.Fill8(0xab, s); err != nil {
			t.Fatalf("%s: Fill8: %v", name, err)
		}
		head, err := b.Slice(0, uint64(len(src)))
		if err != nil {
			t.Fatal(err)
		}
		if err := buffer.CopyFromHost(head, src, s); err != nil {
			t.Fatalf("%s: CopyFromHost: %v", name, err)
		}
		got := make([]byte, len(src)+3)
		if err := buffer.CopyToHost(got, b, s); err != nil {
			t.Fatalf("%s: CopyToHost: %v", name, err)
		}
		if !bytes.Equal(got[:len(src)], src) || !bytes.Equal(got[len(src):], []byte{0xab, 0xab, 0xab}) {
			t.Errorf("%s: read back %q", name, got)
		}
		closeAll(t, head, b)
	}

	// Pools belong to the GPU: a primary-view pool allocates on the view's
	// stream; another GPU's pool refuses it.
	p0, err := resource.CurrentDevicePool(d0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p0.Allocate(64, s)
	if err != nil {
		t.Errorf("pool of %v on a stream of %v: %v", d0, v, err)
	} else {
		closeAll(t, b)
	}
	p1, err := resource.CurrentDevicePool(d1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p1.Allocate(64, s)
	wantErr(t, "pool of GPU 1, stream of a GPU 0 view", err, "DevicePool.Allocate")
	if !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("want ErrInvalidArgument, got %v", err)
	}

	if err := owned.Close(); err != nil {
		t.Errorf("close %v: %v", owned, err)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := fake.Stat(fakecuda.Contexts); n != 0 {
		t.Errorf("%d contexts left", n)
	}
	// Everything made from the closed view is refused with ErrClosed, and
	// the stream's Close only marks it.
	if err := s.Close(); err != nil {
		t.Errorf("Close of a stream of a destroyed context: %v", err)
	}
	if _, err := current.Allocate(64, nil); !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("Allocate through a closed view: %v, want ErrClosed", err)
	}
	if _, err := resource.NewDevicePool(v, nil); !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("NewDevicePool of a closed view: %v, want ErrClosed", err)
	}
}

// Hostile handles and values of the foreign-context API on the fake: clear
// errors, no panic, nothing created.
func TestContextHostileInput(t *testing.T) {
	defer baseline(t)()
	d0 := dev(t, 0)
	for _, h := range []uintptr{0, 1, 2, 0xdead, ^uintptr(0)} {
		noPanic(t, "WrapContext", func() {
			_, err := cuda.WrapContext(h)
			wantErr(t, "WrapContext of garbage", err, "WrapContext")
		})
	}
	for _, h := range []uintptr{2, 0xdead, 0xbad0, ^uintptr(0)} {
		noPanic(t, "WrapStream", func() {
			_, err := d0.WrapStream(h)
			wantErr(t, "WrapStream of garbage", err, "Device.WrapStream")
		})
	}
	for _, f := range []cuda.ContextFlags{0x100, 3, 5, 6, 7, 0x80000000} {
		_, err := d0.NewContext(f)
		wantErr(t, "NewContext with bad flags", err, "Device.NewContext")
	}
	var zero cuda.Context
	noPanic(t, "zero Context", func() {
		if err := zero.Close(); err != nil {
			t.Error(err)
		}
		wantErr(t, "zero Context Sync", zero.Sync(), "Context.Sync")
	})
}

// Handles cudamem destroyed, handed back: WrapContext and WrapGreenContext
// refuse them before the driver (which may crash on a destroyed handle:
// the fake counts such calls), with errors naming the operation and the
// handle. Nothing is left behind and no crash-prone call is made.
func TestDestroyedHandlesRefused(t *testing.T) {
	defer baseline(t)()
	d1 := dev(t, 1)
	c, err := d1.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	h := c.Handle()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = cuda.WrapContext(h)
	wantErr(t, "WrapContext of a closed context", err, "WrapContext")
	if !errors.Is(err, cuda.ErrInvalidArgument) || !errors.Is(err, cuda.ErrorInvalidContext) || !strings.Contains(err.Error(), fmt.Sprintf("%#x", h)) {
		t.Errorf("WrapContext of a closed context: %v; want ErrInvalidArgument and CUDA_ERROR_INVALID_CONTEXT naming %#x", err, h)
	}
	g, err := d1.NewGreenContext(8)
	if err != nil {
		t.Fatal(err)
	}
	gh := g.Device().GreenContext()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = cuda.WrapGreenContext(gh)
	wantErr(t, "WrapGreenContext of a closed green context", err, "WrapGreenContext")
	if !errors.Is(err, cuda.ErrInvalidArgument) || !errors.Is(err, cuda.ErrorInvalidHandle) {
		t.Errorf("WrapGreenContext of a closed green context: %v", err)
	}
	if n := fake.Stat(fakecuda.Crashes); n != 0 {
		t.Errorf("%d calls on destroyed handles reached the driver", n)
	}
}
