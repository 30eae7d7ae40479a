package trace

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkInvariants replays ops on a live set: every ID allocated while
// not live, freed only while live, once; nothing live at the end; sizes
// above zero.
func checkInvariants(t *testing.T, ops []Op) {
	t.Helper()
	live := map[uint64]bool{}
	for i, op := range ops {
		if op.Free {
			require.True(t, live[op.ID], "op %d frees %d, not live", i, op.ID)
			delete(live, op.ID)
			continue
		}
		require.False(t, live[op.ID], "op %d allocates %d, live already", i, op.ID)
		require.Positive(t, op.Size, "op %d", i)
		live[op.ID] = true
	}
	require.Empty(t, live, "every allocation is freed by the end")
}

func TestGenerateRoundTrip(t *testing.T) {
	for _, kind := range Kinds {
		t.Run(kind, func(t *testing.T) {
			ops, err := Generate(kind, 1, 0)
			require.NoError(t, err)
			require.NotEmpty(t, ops)
			checkInvariants(t, ops)
			var buf bytes.Buffer
			require.NoError(t, Write(&buf, ops))
			back, err := Parse(&buf, Limits{MaxSize: 1 << 40})
			require.NoError(t, err)
			assert.Equal(t, ops, back)
			s := Summarize(ops)
			assert.Equal(t, s.Allocations, s.Frees)
			assert.Zero(t, s.LiveAtEnd)
			assert.Positive(t, s.PeakLive)
			t.Logf("%s: %d allocations, peak %d bytes live in %d allocations", kind, s.Allocations, s.PeakLive, s.PeakCount)
		})
	}
}

// Every seed's trace is a valid one: no size 0 (a step with no request
// once allocated activations of 0 bytes), every ID freed once.
func TestGenerateSeeds(t *testing.T) {
	for _, kind := range Kinds {
		for seed := range uint64(40) {
			ops, err := Generate(kind, seed, 30)
			require.NoError(t, err)
			checkInvariants(t, ops)
		}
	}
}

func TestGenerateDeterministic(t *testing.T) {
	for _, kind := range Kinds {
		a, err := Generate(kind, 7, 50)
		require.NoError(t, err)
		b, err := Generate(kind, 7, 50)
		require.NoError(t, err)
		assert.Equal(t, a, b, "%s: same seed, same trace", kind)
		c, err := Generate(kind, 8, 50)
		require.NoError(t, err)
		assert.NotEqual(t, a, c, "%s: another seed, another trace", kind)
	}
}

// The serving trace has the shape it claims: KV caches at powers of two
// of 32 KiB per token, each regrown cache allocated before the old one
// is freed, activations sized by the step's tokens.
func TestServingShape(t *testing.T) {
	ops, err := Generate("serving", 3, 200)
	require.NoError(t, err)
	sizes := map[uint64]uint64{}
	kv := 0
	for _, op := range ops {
		if op.Free {
			continue
		}
		sizes[op.ID] = op.Size
		if op.Size%kvPerToken == 0 {
			if n := op.Size / kvPerToken; n&(n-1) == 0 && n >= 16 {
				kv++
			}
		}
	}
	assert.Positive(t, kv, "KV caches")
	s := Summarize(ops)
	assert.Greater(t, s.PeakLive, uint64(100<<20))
}

func TestGenerateErrors(t *testing.T) {
	_, err := Generate("inference", 1, 0)
	assert.ErrorContains(t, err, `unknown trace kind "inference"`)
	_, err = Generate("serving", 1, -1)
	assert.ErrorContains(t, err, "steps -1 out of range")
	_, err = Generate("random", 1, MaxSteps+1)
	assert.ErrorContains(t, err, "out of range")
}

// The format the other replayers write: "f ID 0" for frees, blank lines
// and comments skipped.
func TestParseAccepts(t *testing.T) {
	ops, err := Parse(strings.NewReader("# a comment\na 1 100\n\na 2 5\n  f 1 0\nf 2\n"), Limits{})
	require.NoError(t, err)
	assert.Equal(t, []Op{{ID: 1, Size: 100}, {ID: 2, Size: 5}, {Free: true, ID: 1}, {Free: true, ID: 2}}, ops)
	// An ID may come back once freed.
	_, err = Parse(strings.NewReader("a 1 1\nf 1\na 1 2\nf 1\n"), Limits{})
	require.NoError(t, err)
}

// Every malformed line is an error naming the line's number and text.
func TestParseRejects(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a 1 100\nx 1\n", `line 2: "x 1": unknown operation "x"`},
		{"a 1\n", `line 1: "a 1": want "a ID SIZE"`},
		{"a 1 2 3\n", `want "a ID SIZE"`},
		{"a one 2\n", `ID "one" is not a decimal number`},
		{"a 1 -2\n", `SIZE "-2" is not a decimal number`},
		{"a 1 0x10\n", `SIZE "0x10"`},
		{"a 1 18446744073709551616\n", `SIZE "18446744073709551616" is not a decimal number of 64 bits`},
		{"a 1 0\n", `line 1: "a 1 0": size 0`},
		{"a 1 1025\n", "size 1025 exceeds the limit of 1024 bytes"},
		{"a 1 5\na 1 6\n", `line 2: "a 1 6": ID 1 is already live`},
		{"f 9\n", `line 1: "f 9": free of ID 9, which is not live`},
		{"a 1 5\nf 1\nf 1\n", `line 3: "f 1": free of ID 1, which is not live`},
		{"a 1 5\nf 1 7\n", `want "f ID" (or "f ID 0")`},
		{"f\n", `want "f ID"`},
		{"a 1 5\n" + strings.Repeat("9", MaxLine+10) + "\n", "line 2: longer than 256 bytes"},
		{"a 1 5\na 2 5\na 3 5\n", "line 3: \"a 3 5\": more than 2 allocations live at once"},
	} {
		_, err := Parse(strings.NewReader(c.in), Limits{MaxSize: 1024, MaxLive: 2})
		if assert.Error(t, err, "%q", c.in) {
			assert.ErrorIs(t, err, ErrBadTrace, c.in)
			assert.Contains(t, err.Error(), c.want, c.in)
		}
	}
}

// After an error the reader stays failed: no line after a bad one is
// taken for good.
func TestReaderStopsAtError(t *testing.T) {
	r := NewReader(strings.NewReader("f 1\na 1 5\n"), Limits{})
	_, err := r.Next()
	require.ErrorIs(t, err, ErrBadTrace)
	_, err2 := r.Next()
	assert.Equal(t, err, err2)
	assert.Zero(t, r.Live())
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReaderIOError(t *testing.T) {
	r := NewReader(io.MultiReader(strings.NewReader("a 1 5\n"), failingReader{}), Limits{})
	op, err := r.Next()
	require.NoError(t, err)
	assert.Equal(t, Op{ID: 1, Size: 5}, op)
	assert.Equal(t, 1, r.Live())
	assert.Equal(t, []uint64{1}, r.LiveIDs())
	_, err = r.Next()
	assert.ErrorContains(t, err, "reading the trace after line 1: disk on fire")
	assert.NotErrorIs(t, err, ErrBadTrace)
}

func FuzzParse(f *testing.F) {
	f.Add("a 1 5\nf 1 0\n")
	f.Add("a 1 5\na 1 5\n")
	f.Fuzz(func(t *testing.T, in string) {
		ops, err := Parse(strings.NewReader(in), Limits{MaxSize: 1 << 20, MaxLive: 64})
		if err != nil {
			return
		}
		// What parses writes back to the same operations.
		var buf bytes.Buffer
		require.NoError(t, Write(&buf, ops))
		back, err := Parse(&buf, Limits{MaxSize: 1 << 20, MaxLive: 64})
		require.NoError(t, err)
		assert.Equal(t, ops, back)
	})
}
