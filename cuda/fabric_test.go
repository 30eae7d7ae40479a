package cuda

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// TestMemFabricHandleLayout pins CUmemFabricHandle: 64 bytes of data, byte
// aligned, so an array of them or one inside a message has no padding.
func TestMemFabricHandleLayout(t *testing.T) {
	if n := unsafe.Sizeof(MemFabricHandle{}); n != 64 {
		t.Fatalf("sizeof(CUmemFabricHandle) = %d, want 64", n)
	}
	if a := unsafe.Alignof(MemFabricHandle{}); a != 1 {
		t.Fatalf("alignof(CUmemFabricHandle) = %d, want 1", a)
	}
}

func testFabricHandle() MemFabricHandle {
	var h MemFabricHandle
	for i := range h.Data {
		h.Data[i] = byte(i*7 + 1)
	}
	return h
}

func TestMemFabricHandleMarshal(t *testing.T) {
	h := testFabricHandle()
	b, err := h.MarshalBinary()
	if err != nil || len(b) != IPCHandleSize {
		t.Fatalf("MarshalBinary: %d bytes, %v", len(b), err)
	}
	b[0] ^= 0xff // the encoding is a copy, not the handle's own array
	if h.Data[0] != 1 {
		t.Fatal("MarshalBinary aliases the handle")
	}
	b[0] ^= 0xff
	var got MemFabricHandle
	if err := got.UnmarshalBinary(b); err != nil || got != h {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	for _, n := range []int{0, 1, 63, 65, 128} {
		var u MemFabricHandle
		err := u.UnmarshalBinary(make([]byte, n))
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprint(n)) {
			t.Errorf("%d bytes: %v", n, err)
		}
		if !u.IsZero() {
			t.Errorf("%d bytes: handle changed on error", n)
		}
	}
	u := h
	if err := u.UnmarshalBinary(make([]byte, 64)); !errors.Is(err, ErrInvalidArgument) || u != h {
		t.Errorf("all-zero handle: %v (handle changed: %v)", err, u != h)
	}
	var nilh *MemFabricHandle
	if err := nilh.UnmarshalBinary(b); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil receiver: %v", err)
	}
}

// TestMemFabricHandleString: the string names the handle without its bytes
// (they are a capability: whoever has them can map the memory).
func TestMemFabricHandleString(t *testing.T) {
	h := testFabricHandle()
	s := h.String()
	b, _ := h.MarshalBinary()
	if strings.Contains(s, hex.EncodeToString(b[:8])) || strings.Contains(s, fmt.Sprint(b[:8])) {
		t.Errorf("String dumps the handle: %s", s)
	}
	g := h
	g.Data[63]++
	if g.String() == s {
		t.Errorf("two handles print alike: %s", s)
	}
	if z := (MemFabricHandle{}).String(); !strings.Contains(z, "zero") {
		t.Errorf("zero handle: %s", z)
	}
}

// TestFabricError: the driver's refusals become ErrNotSupported naming
// IMEX, keeping the Result; anything else passes unchanged.
func TestFabricError(t *testing.T) {
	for _, r := range []Result{ErrorNotPermitted, ErrorNotSupported} {
		err := FabricError("cuMemCreate", &OpError{Op: "cuMemCreate", Err: r})
		if !errors.Is(err, ErrNotSupported) || !errors.Is(err, r) {
			t.Errorf("%v: %v does not match both ErrNotSupported and the Result", r, err)
		}
		for _, w := range []string{"IMEX", "nvidia-imex", "NVLink", "cuMemCreate", r.Error()} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %q does not say %q", r, err, w)
			}
		}
		again := FabricError("x", err)
		if strings.Count(again.Error(), "IMEX service") != 1 {
			t.Errorf("explained twice: %v", again)
		}
	}
	other := &OpError{Op: "cuMemCreate", Err: ErrorOutOfMemory}
	if got := FabricError("cuMemCreate", other); got != other {
		t.Errorf("out of memory changed: %v", got)
	}
	if FabricError("x", nil) != nil {
		t.Error("nil became an error")
	}
}

func TestFabricNilDevice(t *testing.T) {
	var d *Device
	fh := testFabricHandle()
	if _, err := d.MemExportFabric(1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("MemExportFabric: %v", err)
	}
	if _, err := d.MemImportFabric(&fh); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("MemImportFabric: %v", err)
	}
	if _, err := d.MemImportFabric(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("MemImportFabric(nil): %v", err)
	}
	if _, err := d.ImportMemPoolFabric(&MemFabricHandle{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("ImportMemPoolFabric(zero): %v", err)
	}
	if _, err := d.FabricHandlesSupported(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("FabricHandlesSupported: %v", err)
	}
	if err := d.CheckFabric(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("CheckFabric: %v", err)
	}
	if _, err := (MemPool{}).ExportFabric(); err == nil {
		t.Error("zero MemPool ExportFabric: no error")
	}
}

func FuzzMemFabricHandleUnmarshal(f *testing.F) {
	h := testFabricHandle()
	b, _ := h.MarshalBinary()
	f.Add(b)
	f.Add(make([]byte, 64))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h MemFabricHandle
		if err := h.UnmarshalBinary(b); err != nil {
			if !h.IsZero() {
				t.Fatal("changed on error")
			}
			return
		}
		out, _ := h.MarshalBinary()
		if string(out) != string(b) {
			t.Fatal("round trip differs")
		}
	})
}
