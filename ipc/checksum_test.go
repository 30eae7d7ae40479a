package ipc

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestChecksumIsCRC32IEEE: the constant-table checksum is hash/crc32's
// IEEE checksum, so the wire format is unchanged.
func TestChecksumIsCRC32IEEE(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if got, want := checksum(b), crc32.ChecksumIEEE(b); got != want {
			t.Fatalf("%d bytes: checksum %#x, crc32 %#x", n, got, want)
		}
	}
}

func FuzzChecksum(f *testing.F) {
	f.Add([]byte("cudamem"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := checksum(b), crc32.ChecksumIEEE(b); got != want {
			t.Fatalf("checksum %#x, crc32 %#x", got, want)
		}
	})
}
