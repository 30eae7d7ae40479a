package virtual

import (
	"encoding/binary"
	"math"
	"math/bits"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// TestImportRejectsChunkOverflow: chunk sizes that add up past 2^64 wrapped
// to a small total, which passed the size check and reached the driver.
// They must be refused before any driver call.
func TestImportRejectsChunkOverflow(t *testing.T) {
	r, f := newFakeResource(t, testGran, nil)
	calls := f.calls                                    // New's own calls
	big := uint64(math.MaxUint64) / testGran * testGran // the largest multiple of gran
	for name, chunks := range map[string][]Chunk{
		"two wrap to gran":   {{FD: 5, Size: big}, {FD: 6, Size: 2 * testGran}},
		"many halves":        {{FD: 5, Size: 1 << 63}, {FD: 5, Size: 1 << 63}, {FD: 5, Size: testGran}},
		"wrap to exactly 0?": {{FD: 5, Size: 1 << 63}, {FD: 6, Size: 1 << 63}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := r.Import(chunks, testGran)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "2^64")
			assert.Equal(t, calls, f.calls, "the driver was called: %v", f.log)
		})
	}
}

// TestFaultSweepVirtualImport fails each driver call of an import of
// three chunks in turn: the import fails naming the driver's
// error and leaves nothing reserved, imported or mapped; unarmed, it then
// works and its Close gives everything back.
func TestFaultSweepVirtualImport(t *testing.T) {
	// Descriptors the fake never made import as one granule each. They
	// must be open and of a kind an export can be (Import checks).
	fds := devNullFDs(t, 3)
	chunks := []Chunk{{FD: fds[0], Size: testGran}, {FD: fds[1], Size: testGran}, {FD: fds[2], Size: testGran}}
	import1 := func(r *Resource) error {
		nb, err := r.Import(chunks, 3*testGran)
		if err != nil {
			return err
		}
		return nb.Close()
	}
	r, f := newFakeResource(t, testGran, nil)
	before := f.calls
	require.NoError(t, import1(r))
	n := f.calls - before
	require.Greater(t, n, 2)
	pairs := 0
	for k := 1; k <= n; k++ {
		for _, sticky := range []bool{false, true} {
			r, f := newFakeResource(t, testGran, nil)
			f.failAt(k, sticky)
			nb, err := r.Import(chunks, 3*testGran)
			f.heal()
			if err == nil {
				// Only the Close's calls were left to fail.
				require.NoError(t, nb.Close())
			} else {
				require.ErrorIs(t, err, cuda.ErrorUnknown, "k=%d", k)
				require.Contains(t, err.Error(), "virtual.Import")
				require.Nil(t, nb)
			}
			require.NoError(t, r.Reclaim(), "k=%d sticky=%v", k, sticky)
			checkInvariants(t, r, f)
			require.Empty(t, f.resv, "k=%d sticky=%v: address space left reserved", k, sticky)
			require.Empty(t, f.maps, "k=%d sticky=%v: mappings left", k, sticky)
			require.NoError(t, import1(r), "k=%d: the resource must still work", k)
			pairs++
		}
	}
	t.Logf("%d (import, failing call) pairs", pairs)
}

// devNullFDs opens the null device n times and returns the descriptors,
// closed when the test ends: open descriptors of a kind a driver's
// export can be (a character device), for imports through the fake
// driver, which needs no particular file behind them.
func devNullFDs(t *testing.T, n int) []int {
	t.Helper()
	var fds []int
	for range n {
		f, err := os.Open(os.DevNull)
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		fds = append(fds, int(f.Fd()))
	}
	return fds
}

func TestCheckChunks(t *testing.T) {
	g := uint64(testGran)
	for _, tc := range []struct {
		name   string
		chunks []Chunk
		size   uint64
		total  uint64
		want   string // "" means accepted
	}{
		{"one", []Chunk{{3, g}}, g, g, ""},
		{"partial size", []Chunk{{3, g}, {4, 2 * g}}, g + 1, 3 * g, ""},
		{"none", nil, g, 0, "no chunks"},
		{"negative fd", []Chunk{{-1, g}}, g, 0, "fd -1"},
		{"zero size chunk", []Chunk{{3, 0}}, g, 0, "positive multiple"},
		{"unaligned chunk", []Chunk{{3, g + 1}}, g, 0, "positive multiple"},
		{"size 0", []Chunk{{3, g}}, 0, 0, "size 0"},
		{"size beyond the chunks", []Chunk{{3, g}}, g + 1, 0, "want 1 to"},
		{"size near 2^64", []Chunk{{3, g}}, math.MaxUint64, 0, "want 1 to"},
		{"sum past 2^64", []Chunk{{3, 1 << 63}, {3, 1 << 63}}, g, 0, "2^64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total, err := checkChunks(tc.chunks, tc.size, g)
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.total, total)
				return
			}
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := checkChunks([]Chunk{{3, g}}, g, 0)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestCloseChunksSkipsZeroChunks(t *testing.T) {
	// A zero Chunk (fd 0, size 0) is not an export: closing it must not
	// close stdin. A negative fd is skipped too.
	assert.NoError(t, CloseChunkFDs([]Chunk{{}, {FD: -1, Size: testGran}}))
	err := CloseChunkFDs([]Chunk{{FD: 1 << 20, Size: testGran}})
	assert.Error(t, err, "a failed close is reported")
}

// FuzzCheckChunks: chunk lists decoded from bytes (12 bytes a chunk: fd,
// size). Whatever is accepted is well formed: positive multiples of the
// granularity whose exact sum (computed with carries) fits in 64 bits and
// covers size; anything whose sum overflows is refused.
func FuzzCheckChunks(f *testing.F) {
	enc := func(cs ...Chunk) []byte {
		var b []byte
		for _, c := range cs {
			b = binary.LittleEndian.AppendUint32(b, uint32(int32(c.FD)))
			b = binary.LittleEndian.AppendUint64(b, c.Size)
		}
		return b
	}
	f.Add(enc(Chunk{3, testGran}), uint64(testGran), uint64(testGran))
	f.Add(enc(Chunk{3, 1 << 63}, Chunk{4, 1 << 63}), uint64(testGran), uint64(testGran))
	f.Add(enc(Chunk{-1, testGran}), uint64(1), uint64(testGran))
	f.Add(enc(Chunk{3, testGran}, Chunk{4, testGran}), uint64(math.MaxUint64), uint64(4096))
	f.Fuzz(func(t *testing.T, b []byte, size, gran uint64) {
		var chunks []Chunk
		for len(b) >= 12 {
			chunks = append(chunks, Chunk{FD: int(int32(binary.LittleEndian.Uint32(b))), Size: binary.LittleEndian.Uint64(b[4:])})
			b = b[12:]
		}
		var sum, carry uint64
		for _, c := range chunks {
			var cy uint64
			sum, cy = bits.Add64(sum, c.Size, 0)
			carry += cy
		}
		total, err := checkChunks(chunks, size, gran)
		if err != nil {
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			return
		}
		assert.Zero(t, carry, "a sum past 2^64 was accepted")
		assert.Equal(t, sum, total)
		assert.NotZero(t, size)
		assert.LessOrEqual(t, size, total)
		for _, c := range chunks {
			assert.GreaterOrEqual(t, c.FD, 0)
			assert.NotZero(t, c.Size)
			assert.Zero(t, c.Size%gran)
		}
	})
}
