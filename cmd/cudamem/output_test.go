package main

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/resource/timeline"
)

// writeTrace writes a small trace (30 allocations, half freed) to name.
func writeTrace(t *testing.T, name string) {
	t.Helper()
	rec := timeline.NewRecorder(&testutil.MadeUp{}, nil, &timeline.RecorderOptions{Name: "pool"})
	var keep []*buffer.Buffer
	for i := range 30 {
		b, err := rec.Allocate(uint64(i+1)<<12, nil)
		require.NoError(t, err)
		if i%2 == 0 {
			require.NoError(t, b.Close())
		} else {
			keep = append(keep, b)
		}
	}
	f, err := os.Create(name)
	require.NoError(t, err)
	require.NoError(t, rec.Log().Trace().WriteJSON(f))
	require.NoError(t, f.Close())
	for _, b := range keep {
		require.NoError(t, b.Close())
	}
}

// dirNames lists dir's entries.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// An output that names an input, however spelled (the same string, another
// path to it, a hard or symbolic link), is refused before anything is
// written: the input stays as it was. timeline -in t.json -o t.json used to
// overwrite its input with the SVG and exit 0.
func TestTimelineRefusesOutputThatIsTheInput(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "t.json")
	writeTrace(t, in)
	orig, err := os.ReadFile(in)
	require.NoError(t, err)
	hard, soft := filepath.Join(dir, "hard.json"), filepath.Join(dir, "soft.json")
	require.NoError(t, os.Link(in, hard))
	require.NoError(t, os.Symlink(in, soft))
	other := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(other, 0o755))
	for _, args := range [][]string{
		{"-in", in, "-o", in},
		{"-in", in, "-o", filepath.Join(other, "..", "t.json")},
		{"-in", in, "-o", hard},
		{"-in", soft, "-o", in},
		{"-in", in, "-o", soft},
		{"-in", in, "-o", filepath.Join(dir, "x.svg"), "-json", hard},
		{"-in", in, "-o", filepath.Join(dir, "x.svg"), "-chrome", in},
	} {
		code, stdout, stderr := runCmd(append([]string{"timeline"}, args...)...)
		assert.Equal(t, 2, code, "%q: %s", args, stderr)
		assert.Empty(t, stdout, args)
		assert.Contains(t, stderr, "would overwrite the input -in", args)
		got, err := os.ReadFile(in)
		require.NoError(t, err)
		assert.Equal(t, orig, got, "%q: the input is unchanged", args)
	}
	assert.Equal(t, []string{"hard.json", "soft.json", "sub", "t.json"}, dirNames(t, dir), "nothing made")

	// Two outputs that are one file are refused too, however spelled.
	code, _, stderr := runCmd("timeline", "-in", in, "-o", filepath.Join(dir, "a.svg"), "-json", filepath.Join(other, "..", "a.svg"))
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "-o and -json name the same output")
}

// A failure after the outputs were opened leaves no output behind and
// every existing one as it was, whichever output or step failed: an -at
// out of range used to leave a 0-byte SVG.
func TestTimelineFailureLeavesOutputsAsTheyWere(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "t.json")
	writeTrace(t, in)
	old := filepath.Join(dir, "old.svg")
	require.NoError(t, os.WriteFile(old, []byte("old picture"), 0o640))
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"version": 1, "events": [`), 0o644))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-in", in, "-o", filepath.Join(dir, "new.svg"), "-json", filepath.Join(dir, "new.json"), "-at", "999"}, 2, "-at 999 is no event of the trace (its events are 1 to 45)"},
		{[]string{"-in", in, "-o", old, "-at", "999"}, 2, "-at 999"},
		{[]string{"-in", bad, "-o", old, "-chrome", filepath.Join(dir, "new.trace")}, 1, "reading the trace " + bad + ": unexpected EOF"},
		{[]string{"-in", filepath.Join(dir, "missing.json"), "-o", old}, 1, "reading the trace: open " + filepath.Join(dir, "missing.json")},
	} {
		code, stdout, stderr := runCmd(append([]string{"timeline"}, c.args...)...)
		assert.Equal(t, c.code, code, "%q: %s", c.args, stderr)
		assert.Empty(t, stdout, c.args)
		assert.Contains(t, stderr, c.want, c.args)
		assert.NotContains(t, stderr, "cuda:", "%q: not a CUDA error", c.args)
		assert.NotContains(t, stderr, "invalid argument", c.args)
		assert.Equal(t, []string{"bad.json", "old.svg", "t.json"}, dirNames(t, dir), "%q: no output, no temporary file left", c.args)
		data, err := os.ReadFile(old)
		require.NoError(t, err)
		assert.Equal(t, "old picture", string(data), c.args)
	}
	// And success replaces the old file whole, keeping its permissions.
	code, _, stderr := runCmd("timeline", "-in", in, "-o", old, "-at", "45")
	require.Equal(t, 0, code, stderr)
	data, err := os.ReadFile(old)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(data), "<svg") || strings.HasPrefix(string(data), "<?xml"), "%.40q", data)
	st, err := os.Stat(old)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o640), st.Mode().Perm())
	assert.Equal(t, []string{"bad.json", "old.svg", "t.json"}, dirNames(t, dir))
}

// The error texts of -in say what failed, in words of the command line:
// no cuda sentinel, no library method name.
func TestTimelineInputErrorsSayWhatFailed(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ content, want string }{
		{`{"version": 9, "events": []}`, "trace version 9; this reader knows version 1"},
		{`not json`, "invalid character 'o' in literal null (expecting 'u')"},
		{`{"version": 1, "events": [{"seq": 2, "kind": "alloc"}, {"seq": 1, "kind": "alloc"}]}`, "events[1]: sequence numbers do not increase"},
		{`{"version": 1, "events": [{"seq": 1, "kind": "grow"}]}`, `unknown event kind "grow" (want alloc, free, sleep or wake)`},
	} {
		in := filepath.Join(dir, "in.json")
		require.NoError(t, os.WriteFile(in, []byte(c.content), 0o644))
		code, _, stderr := runCmd("timeline", "-in", in, "-o", "-")
		assert.Equal(t, 1, code, stderr)
		assert.Equal(t, "cudamem timeline: reading the trace "+in+": "+c.want+"\n", stderr)
	}
}

func TestOutFile(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "out.txt")
	fill := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}

	// A new file: nothing there until the write completes.
	o, err := openOut("-o", name, nil)
	require.NoError(t, err)
	_, err = os.Stat(name)
	assert.ErrorIs(t, err, fs.ErrNotExist, "not made before it is written")
	require.NoError(t, o.write(fill("one")))
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	assert.Equal(t, "one", string(data))
	assert.ErrorContains(t, o.write(fill("again")), "already written")

	// A fill that fails half way: the old contents stay, no temporary
	// file is left.
	o, err = openOut("-o", name, nil)
	require.NoError(t, err)
	boom := errors.New("boom")
	err = o.write(func(w io.Writer) error { _, _ = io.WriteString(w, "partial"); return boom })
	assert.ErrorIs(t, err, boom)
	assert.ErrorContains(t, err, "writing "+name)
	data, err = os.ReadFile(name)
	require.NoError(t, err)
	assert.Equal(t, "one", string(data))
	assert.Equal(t, []string{"out.txt"}, dirNames(t, dir))

	// Discarded: the same.
	o, err = openOut("-o", name, nil)
	require.NoError(t, err)
	o.discard()
	o.discard()
	assert.Equal(t, []string{"out.txt"}, dirNames(t, dir))
	assert.ErrorContains(t, o.write(fill("late")), "already written")

	// Prepared but not committed, then discarded (a later output of the
	// same command failed): nothing in place, nothing left.
	o, err = openOut("-o", filepath.Join(dir, "first.txt"), nil)
	require.NoError(t, err)
	require.NoError(t, o.prepare(fill("first")))
	o2, err := openOut("-json", name, nil)
	require.NoError(t, err)
	require.ErrorIs(t, o2.prepare(func(io.Writer) error { return boom }), boom)
	o2.discard()
	o.discard()
	assert.Equal(t, []string{"out.txt"}, dirNames(t, dir))
	assert.NoError(t, o.commit(), "a discarded output commits nothing")
	assert.Equal(t, []string{"out.txt"}, dirNames(t, dir))

	// Through a symbolic link: the file it leads to is replaced, the link
	// stays a link.
	link := filepath.Join(dir, "link.txt")
	require.NoError(t, os.Symlink(name, link))
	o, err = openOut("-o", link, nil)
	require.NoError(t, err)
	require.NoError(t, o.write(fill("two")))
	data, err = os.ReadFile(name)
	require.NoError(t, err)
	assert.Equal(t, "two", string(data))
	st, err := os.Lstat(link)
	require.NoError(t, err)
	assert.Equal(t, fs.ModeSymlink, st.Mode().Type())

	// A device is written in place, not replaced.
	o, err = openOut("-o", os.DevNull, nil)
	require.NoError(t, err)
	require.NoError(t, o.write(fill("nothing")))
	st, err = os.Stat(os.DevNull)
	require.NoError(t, err)
	assert.NotZero(t, st.Mode()&fs.ModeDevice, "still a device")

	// A directory, or a file in a directory that is not there, is refused
	// at once, naming the flag and the file.
	_, err = openOut("-json", dir, nil)
	assert.ErrorContains(t, err, "-json "+dir+": is a directory")
	missing := filepath.Join(dir, "no", "such", "x.svg")
	_, err = openOut("-o", missing, nil)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, missing)
	assert.NotContains(t, err.Error(), ".tmp-", "the error names the file asked for")
}

func TestSameFile(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	require.NoError(t, os.WriteFile(a, nil, 0o644))
	require.NoError(t, os.Link(a, filepath.Join(dir, "hard")))
	require.NoError(t, os.Symlink(a, filepath.Join(dir, "soft")))
	require.NoError(t, os.Symlink(dir, filepath.Join(dir, "dirlink")))
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{a, a, true},
		{a, filepath.Join(dir, ".", "x", "..", "a"), true},
		{a, filepath.Join(dir, "hard"), true},
		{a, filepath.Join(dir, "soft"), true},
		{filepath.Join(dir, "new"), filepath.Join(dir, "dirlink", "new"), true}, // neither exists yet
		{a, filepath.Join(dir, "b"), false},
		{"-", "-", true},
		{"-", a, false},
		{"", a, false},
	} {
		assert.Equal(t, c.same, sameFile(c.a, c.b), "%s, %s", c.a, c.b)
	}
}

// bench's outputs may not name its baseline program or each other, and
// -svg - is refused (it would mix the chart into the table): usage errors
// before any driver is looked for.
func TestBenchOutputConflicts(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "cgo-baseline")
	require.NoError(t, os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-cgo", prog, "-svg", prog}, "-svg " + prog + " would overwrite the input -cgo names"},
		{[]string{"-cgo", prog, "-cpuprofile", filepath.Join(dir, ".", "cgo-baseline")}, "would overwrite the input -cgo"},
		{[]string{"-svg", filepath.Join(dir, "x"), "-cpuprofile", filepath.Join(dir, "x")}, "-svg and -cpuprofile name the same output"},
		{[]string{"-svg", "-"}, "-svg - would mix the chart"},
	} {
		code, stdout, stderr := runCmd(append([]string{"bench"}, c.args...)...)
		assert.Equal(t, 2, code, "%q: %s", c.args, stderr)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, c.want, c.args)
		assert.NotContains(t, stderr, "driver", c.args)
	}
	data, err := os.ReadFile(prog)
	require.NoError(t, err)
	assert.Equal(t, "#!/bin/sh\n", string(data))
}
