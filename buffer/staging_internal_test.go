package buffer

import (
	"bytes"
	"reflect"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

func TestParallelCopy(t *testing.T) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	for _, w := range []int{1, 2, 3, 8} {
		stageWorkers = w
		for _, n := range []int{0, 1, 4095, copyPiece, 2*copyPiece + 1, 3<<20 + 77, 9 << 20} {
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(i*7 + n)
			}
			dst := make([]byte, n+3)
			dst[n], dst[n+1], dst[n+2] = 1, 2, 3
			parallelCopy(dst[:n], src)
			if !bytes.Equal(dst[:n], src) {
				t.Fatalf("workers %d, %d bytes: copy differs", w, n)
			}
			assert.Equal(t, []byte{1, 2, 3}, dst[n:], "nothing written past the end")
		}
	}
}

func TestPointerPath(t *testing.T) {
	type inner struct {
		A [4]float64
		P *int
	}
	type outer struct {
		X  uint8
		In [2]inner
	}
	for _, c := range []struct {
		v    any
		want string
	}{
		{int32(0), ""},
		{[3]complex128{}, ""},
		{struct{ A, B uint16 }{}, ""},
		{[0]string{}, ""},
		{uintptr(0), ""},
		{unsafe.Pointer(nil), "T is a unsafe.Pointer"},
		{"", "T is a string"},
		{outer{}, "T.In[i].P is a ptr"},
		{[2][]int{}, "T[i] is a slice"},
	} {
		assert.Equal(t, c.want, pointerPath(reflect.TypeOf(c.v), "T"), "%T", c.v)
	}
}

// The CPU side of staging: moving 256 MiB of pageable memory into pinned-
// sized chunks with 1..8 goroutines.
func BenchmarkParallelCopy(b *testing.B) {
	defer func(w int) { stageWorkers = w }(stageWorkers)
	src := make([]byte, 256<<20)
	dst := make([]byte, 8<<20)
	for i := range src {
		src[i] = byte(i)
	}
	for _, w := range []int{1, 2, 4, 8} {
		b.Run("workers="+string(rune('0'+w)), func(b *testing.B) {
			stageWorkers = w
			b.SetBytes(int64(len(src)))
			for range b.N {
				for off := 0; off < len(src); off += len(dst) {
					parallelCopy(dst, src[off:off+len(dst)])
				}
			}
		})
	}
}
