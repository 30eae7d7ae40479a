package ipc

import (
	"errors"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/cuda"
)

func testFabricHandle(keyed bool) *FabricHandle {
	h := &FabricHandle{uuid: cuda.NewUUID()}
	var fh cuda.MemFabricHandle
	for i := range fh.Data {
		fh.Data[i] = byte(i + 9)
	}
	h.h = sealFabric(fh)
	if keyed {
		h.key = newPoolKey()
	}
	return h
}

// TestFabricHandleEncoding: both forms (with and without a key) round
// trip; every single-bit change, every other length, and encodings with
// a meaning this version does not give are refused, leaving the value as
// it was; String shows neither the key nor the driver's bytes.
func TestFabricHandleEncoding(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		h := testFabricHandle(keyed)
		b, err := h.MarshalBinary()
		if err != nil || len(b) != FabricHandleSize {
			t.Fatalf("MarshalBinary: %d bytes, %v", len(b), err)
		}
		var got FabricHandle
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if got.uuid != h.uuid || !got.key.equal(h.key) || got.h.get() != h.h.get() || got.HasKey() != keyed {
			t.Fatalf("round trip changed the handle (keyed %v)", keyed)
		}
		for i := range b {
			for bit := range 8 {
				bad := append([]byte(nil), b...)
				bad[i] ^= 1 << bit
				var u FabricHandle
				if err := u.UnmarshalBinary(bad); !errors.Is(err, ErrBadFabricHandle) || !u.zero() {
					t.Fatalf("byte %d bit %d: %v", i, bit, err)
				}
			}
		}
		s := h.String()
		fh := h.Fabric()
		if strings.Contains(s, string(fh.Data[:8])) || (keyed && strings.Contains(s, (*h.key.k)[:4])) {
			t.Errorf("String shows secrets: %s", s)
		}
	}
	for _, n := range []int{0, 1, FabricHandleSize - 1, FabricHandleSize + 1} {
		var u FabricHandle
		if err := u.UnmarshalBinary(make([]byte, n)); !errors.Is(err, cuda.ErrInvalidArgument) {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
	var nilh *FabricHandle
	if err := nilh.UnmarshalBinary(nil); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("nil receiver: %v", err)
	}
	if _, err := nilh.MarshalBinary(); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("nil MarshalBinary: %v", err)
	}
	if nilh.UUID() != (UUID{}) || nilh.HasKey() || !nilh.Fabric().IsZero() || nilh.String() != "FabricHandle(zero)" {
		t.Error("nil accessors")
	}
}

func FuzzFabricHandleUnmarshal(f *testing.F) {
	for _, keyed := range []bool{true, false} {
		b, _ := testFabricHandle(keyed).MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte("cudamemP"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h FabricHandle
		if err := h.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrBadFabricHandle) && !errors.Is(err, cuda.ErrInvalidArgument) || !h.zero() {
				t.Fatalf("%v", err)
			}
			return
		}
		out, err := h.MarshalBinary()
		if err != nil || string(out) != string(b) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
