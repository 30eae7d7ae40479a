package kernels

import (
	"bytes"
	"testing"
)

// Every kernel name is an entry of the embedded module, and the text has
// no NUL (LoadModule appends the one the driver needs).
func TestPTXHasEveryKernel(t *testing.T) {
	p := PTX()
	if len(p) == 0 {
		t.Fatal("embedded PTX is empty")
	}
	if bytes.IndexByte(p, 0) >= 0 {
		t.Error("embedded PTX contains a NUL byte")
	}
	for _, name := range []string{PatternWrite, PatternCheck, AddU32, FillU32} {
		if !bytes.Contains(p, []byte(".entry "+name)) {
			t.Errorf("kernel %s is not an entry of kernels.ptx", name)
		}
	}
	p[0] ^= 0xff
	if PTX()[0] == p[0] {
		t.Error("PTX returned shared memory, not a copy")
	}
}

func TestPattern(t *testing.T) {
	got := Pattern(300, 5)
	for i, b := range got {
		if want := byte(uint32(i)*31 + 5); b != want {
			t.Fatalf("byte %d = %d, want %d", i, b, want)
		}
	}
	if len(Pattern(0, 1)) != 0 {
		t.Error("Pattern(0) is not empty")
	}
}
