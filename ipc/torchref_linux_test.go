//go:build linux

package ipc

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// torchCounters is how many counters torch puts in one file.
const torchCounters = 10000

// fakeTorchRefs points the package's shared-memory directory at a
// directory of the test's own.
func fakeTorchRefs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	old := shmDir
	shmDir = dir
	t.Cleanup(func() { shmDir = old })
	return dir
}

// refFile is a counter file as torch's producer makes it: the header
// (its first word the count of the file's users, 1: the producer), then
// the counters, those given set.
type refFile struct {
	t    *testing.T
	path string
}

func newRefFile(t *testing.T, dir, name string, users int32, counters int, set map[int]int64) refFile {
	t.Helper()
	b := make([]byte, torchRefHeader+8*counters)
	binary.NativeEndian.PutUint32(b, uint32(users))
	for i, v := range set {
		binary.NativeEndian.PutUint64(b[torchRefHeader+8*i:], uint64(v))
	}
	path := filepath.Join(dir, strings.TrimPrefix(name, "/"))
	require.NoError(t, os.WriteFile(path, b, 0o600))
	return refFile{t, path}
}

func (f refFile) read() []byte {
	f.t.Helper()
	b, err := os.ReadFile(f.path)
	require.NoError(f.t, err)
	return b
}

func (f refFile) users() int32 { return int32(binary.NativeEndian.Uint32(f.read())) }

func (f refFile) counter(i int) int64 {
	return int64(binary.NativeEndian.Uint64(f.read()[torchRefHeader+8*i:]))
}

func (f refFile) exists() bool {
	_, err := os.Lstat(f.path)
	return err == nil
}

func heldRefs() int {
	torchRefs.Lock()
	defer torchRefs.Unlock()
	return len(torchRefs.m)
}

// TestTorchRefRelease: a share's counter is checked and left alone when
// it is opened, decremented once when the last use of it ends (two opens
// of one share release it once), and the file stays for the producer,
// which still uses it; nothing stays open.
func TestTorchRefRelease(t *testing.T) {
	dir := fakeTorchRefs(t)
	fds := testutil.FDs(t)
	const name = "/torch_4242_1234567890"
	f := newRefFile(t, dir, name, 1, torchCounters, map[int]int64{3: 1, 4: 1})

	r, err := acquireTorchRef("test", name, 3)
	require.NoError(t, err)
	r2, err := acquireTorchRef("test", name, 3)
	require.NoError(t, err)
	assert.Same(t, r, r2, "one share opened twice is held once")
	assert.Equal(t, int64(1), f.counter(3), "nothing is written at open")
	assert.Equal(t, int32(1), f.users())

	require.NoError(t, r.release(true))
	assert.Equal(t, int64(1), f.counter(3), "not released while a use is left")
	require.NoError(t, r2.release(true))
	assert.Equal(t, int64(0), f.counter(3), "released once, at the last use")
	assert.Equal(t, int64(1), f.counter(4), "the next share's counter is untouched")
	assert.Equal(t, int32(1), f.users(), "the users' count is back: the producer's")
	assert.True(t, f.exists(), "the producer still uses the file")
	assert.Zero(t, heldRefs())
	testutil.AssertNoNewFDs(t, fds)

	// A share given up without being opened.
	require.NoError(t, ReleaseTorch(LegacyHandle{RefCounter: name, RefCounterOffset: 4}))
	assert.Equal(t, int64(0), f.counter(4))
	err = ReleaseTorch(LegacyHandle{RefCounter: name, RefCounterOffset: 4})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument, "released twice")
	assert.Contains(t, err.Error(), "nothing to release")
	assert.NoError(t, ReleaseTorch(LegacyHandle{}), "no counter, nothing to do")
	testutil.AssertNoNewFDs(t, fds)
}

// TestTorchRefReleaseTorchRefusesOpenShare: a share open here is
// released by the last Close, not by ReleaseTorch, which would let the
// producer free memory still in use.
func TestTorchRefReleaseTorchRefusesOpenShare(t *testing.T) {
	dir := fakeTorchRefs(t)
	const name = "/torch_1_2"
	f := newRefFile(t, dir, name, 1, 8, map[int]int64{0: 1})
	r, err := acquireTorchRef("test", name, 0)
	require.NoError(t, err)
	err = ReleaseTorch(LegacyHandle{RefCounter: name})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "open here")
	assert.Equal(t, int64(1), f.counter(0))
	require.NoError(t, r.release(true))
	assert.Equal(t, int64(0), f.counter(0))
}

// TestTorchRefDropLeavesShare: an OpenLegacy that fails after the counter
// was opened leaves it as it was, for a retry or ReleaseTorch; so does
// one whose driver calls fail (a device that cannot map).
func TestTorchRefDropLeavesShare(t *testing.T) {
	dir := fakeTorchRefs(t)
	fds := testutil.FDs(t)
	const name = "/torch_7_1094690702_0" // the form torch 2.11 names its files
	f := newRefFile(t, dir, name, 1, 8, map[int]int64{5: 1})
	r, err := acquireTorchRef("test", name, 5)
	require.NoError(t, err)
	require.NoError(t, r.release(false))
	assert.Equal(t, int64(1), f.counter(5))
	assert.Zero(t, heldRefs())

	_, err = OpenLegacy(&cuda.Device{}, LegacyHandle{Size: 4096, RefCounter: name, RefCounterOffset: 5})
	require.Error(t, err, "a zero device maps nothing")
	assert.Equal(t, int64(1), f.counter(5), "the failed open left the share as it was")
	assert.Equal(t, int32(1), f.users())
	assert.Zero(t, heldRefs())
	testutil.AssertNoNewFDs(t, fds)
	require.NoError(t, ReleaseTorch(LegacyHandle{RefCounter: name, RefCounterOffset: 5}))
	assert.Equal(t, int64(0), f.counter(5))
}

// TestTorchRefHostileNames: the name comes from another process and
// becomes a path: only torch's own form passes, before any file is
// touched (a file the hostile name would reach is planted, and stays
// untouched).
func TestTorchRefHostileNames(t *testing.T) {
	dir := fakeTorchRefs(t)
	planted := newRefFile(t, dir, "/torch_1_2", 1, 8, map[int]int64{0: 1})
	sub := filepath.Join(dir, "torch_9_9")
	require.NoError(t, os.Mkdir(sub, 0o700))
	newRefFile(t, sub, "/x", 1, 8, map[int]int64{0: 1})
	for _, name := range []string{
		"torch_1_2", "/torch_1", "/torch_1_2_3_4", "/torch_1_2_", "/torch__2", "/torch_1_", "/torch_",
		"/torch_9_9/x", "/torch_1_2/../torch_1_2", "/../torch_1_2", "/torch_1_2\x00", "/torch_1_2\n",
		"/torch_a_2", "/torch_-1_2", "/torch_+1_2", "/TORCH_1_2", "//torch_1_2", "/torch_1 _2",
		"/torch_" + strings.Repeat("1", 21) + "_2", "/torch_1_" + strings.Repeat("9", 60),
	} {
		for _, op := range []func() error{
			func() error { _, err := acquireTorchRef("test", name, 0); return err },
			func() error { return ReleaseTorch(LegacyHandle{RefCounter: name}) },
			func() error {
				_, err := NewTorchShare(make([]byte, cuda.IPCHandleSize), 0, 1, []byte(name), 0, nil, false)
				return err
			},
			func() error {
				_, err := OpenLegacy(&cuda.Device{}, LegacyHandle{Size: 1, RefCounter: name})
				return err
			},
		} {
			err := op()
			require.ErrorIs(t, err, cuda.ErrInvalidArgument, "%q", name)
			assert.Contains(t, err.Error(), "torch reference-counter name", "%q", name)
		}
	}
	assert.Equal(t, int64(1), planted.counter(0))
	assert.Zero(t, heldRefs())
}

// TestTorchRefHostileFiles: what the name leads to is checked before
// anything is written: a symbolic link, a FIFO, a directory, a file of
// the wrong size or too small for the index, an index past the file, a
// file no process uses any more, a counter already released (or never
// set) are all refused, and nothing is left open.
func TestTorchRefHostileFiles(t *testing.T) {
	dir := fakeTorchRefs(t)
	fds := testutil.FDs(t)
	target := newRefFile(t, dir, "/torch_100_1", 1, 8, map[int]int64{0: 1})
	require.NoError(t, os.Symlink(target.path, filepath.Join(dir, "torch_100_2")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "torch_100_3"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "torch_100_4"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "torch_100_5"), make([]byte, torchRefHeader+8*2+4), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "torch_100_6"), make([]byte, 10), 0o600))
	newRefFile(t, dir, "/torch_100_7", 0, 8, map[int]int64{0: 1})
	newRefFile(t, dir, "/torch_100_8", 1, 8, map[int]int64{0: 0, 1: -3})
	big, err := os.Create(filepath.Join(dir, "torch_100_9"))
	require.NoError(t, err)
	require.NoError(t, big.Truncate(torchRefHeader+8*(torchRefMaxCounters+1)))
	require.NoError(t, big.Close())
	for _, tc := range []struct {
		name  string
		index uint64
		want  string
	}{
		{"/torch_100_2", 0, "too many levels of symbolic links"},
		{"/torch_100_3", 0, "not a regular file"},
		{"/torch_100_4", 0, "is a directory"},
		{"/torch_100_5", 0, "not a header of 64"},
		{"/torch_100_6", 0, "not a header of 64"},
		{"/torch_100_1", 8, "counter 8 asked for, the file holds 8"},
		{"/torch_100_1", torchRefMaxCounters, "at most"},
		{"/torch_100_1", ^uint64(0), "at most"},
		{"/torch_100_7", 0, "counts 0 processes"},
		{"/torch_100_8", 0, "counter 0 is 0"},
		{"/torch_100_8", 1, "counter 1 is -3"},
		{"/torch_100_9", 0, "not a header of 64"},
		{"/torch_100_0", 0, "no such file"},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.name, tc.index), func(t *testing.T) {
			_, err := acquireTorchRef("test", tc.name, tc.index)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			if tc.want != "no such file" && tc.want != "too many levels of symbolic links" && tc.want != "is a directory" {
				assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
			}
			err = ReleaseTorch(LegacyHandle{RefCounter: tc.name, RefCounterOffset: tc.index})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	assert.Equal(t, int64(1), target.counter(0), "the file behind the link is untouched")
	assert.Zero(t, heldRefs())
	testutil.AssertNoNewFDs(t, fds)
}

// TestTorchRefTruncatedUnderRelease: the producer's file truncated after
// it was checked makes the release fail with an error, not crash this
// process on the fault; the file's descriptor is closed all the same.
func TestTorchRefTruncatedUnderRelease(t *testing.T) {
	dir := fakeTorchRefs(t)
	fds := testutil.FDs(t)
	const name = "/torch_5_5"
	f := newRefFile(t, dir, name, 1, torchCounters, map[int]int64{torchCounters - 1: 1})
	r, err := acquireTorchRef("test", name, torchCounters-1)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(f.path, 0))
	err = r.release(true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "faulted")
	assert.Zero(t, heldRefs())
	testutil.AssertNoNewFDs(t, fds)
}

// TestTorchRefReleaseChangedUnder: a counter released (or a file let go
// of) by someone else between the open and the release is not decremented
// below 0, nor the users' count raised from 0: the release says so.
func TestTorchRefReleaseChangedUnder(t *testing.T) {
	dir := fakeTorchRefs(t)
	const name = "/torch_6_6"
	f := newRefFile(t, dir, name, 1, 8, map[int]int64{0: 1, 1: 1})
	r, err := acquireTorchRef("test", name, 0)
	require.NoError(t, err)
	b := f.read()
	binary.NativeEndian.PutUint64(b[torchRefHeader:], 0)
	require.NoError(t, os.WriteFile(f.path, b, 0o600))
	err = r.release(true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the counter is 0")
	assert.Equal(t, int64(0), f.counter(0))
	assert.Equal(t, int32(1), f.users())

	r, err = acquireTorchRef("test", name, 1)
	require.NoError(t, err)
	b = f.read()
	binary.NativeEndian.PutUint32(b, 0)
	require.NoError(t, os.WriteFile(f.path, b, 0o600))
	err = r.release(true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "let go of it")
	assert.Equal(t, int64(1), f.counter(1), "not written")
	assert.Equal(t, int32(0), f.users())
}

// TestTorchRefUnlinkIfSame: the last user removes the file, but only if
// its name still names that file.
func TestTorchRefUnlinkIfSame(t *testing.T) {
	dir := fakeTorchRefs(t)
	const name = "/torch_8_8"
	f := newRefFile(t, dir, name, 1, 8, map[int]int64{0: 1})
	tf, _, err := openTorchRefFile("test", name, 0)
	require.NoError(t, err)
	defer tf.close()
	require.NoError(t, os.Remove(f.path))
	newRefFile(t, dir, name, 1, 8, map[int]int64{0: 1}) // another file under the name
	require.NoError(t, tf.unlinkIfSame())
	assert.True(t, f.exists(), "another file under the name is left alone")

	tf2, _, err := openTorchRefFile("test", name, 0)
	require.NoError(t, err)
	defer tf2.close()
	require.NoError(t, tf2.unlinkIfSame())
	assert.False(t, f.exists(), "the file itself is removed")
	require.NoError(t, tf2.unlinkIfSame(), "gone already: nothing to do")
}

// TestTorchRefInSharedMemory: the name is a shared-memory object's, found
// where shm_open puts it.
func TestTorchRefInSharedMemory(t *testing.T) {
	if st, err := os.Stat(shmDir); err != nil || !st.IsDir() {
		t.Skipf("no %s: %v", shmDir, err)
	}
	name := fmt.Sprintf("/torch_%d_%d", os.Getpid(), 4000000000+uint64(os.Getpid()))
	f := newRefFile(t, shmDir, name, 1, torchCounters, map[int]int64{0: 1})
	t.Cleanup(func() { os.Remove(f.path) })
	require.NoError(t, ReleaseTorch(LegacyHandle{RefCounter: name}))
	assert.Equal(t, int64(0), f.counter(0))
}

// TestNewTorchShare: _share_cuda_()'s values become a LegacyHandle; a bad
// event handle or counter index is refused.
func TestNewTorchShare(t *testing.T) {
	raw := make([]byte, cuda.IPCHandleSize)
	raw[0] = 9
	ev := make([]byte, cuda.IPCHandleSize)
	ev[63] = 7
	h, err := NewTorchShare(append([]byte{2, 'c'}, raw...), 512, 4096, []byte("/torch_1_2"), 17, ev, true)
	require.NoError(t, err)
	assert.Equal(t, byte(9), h.Handle.Reserved[0])
	assert.Equal(t, uint64(512), h.Offset)
	assert.Equal(t, uint64(4096), h.Size)
	assert.Equal(t, "/torch_1_2", h.RefCounter)
	assert.Equal(t, uint64(17), h.RefCounterOffset)
	assert.Equal(t, byte(7), h.Event.Reserved[63])
	assert.True(t, h.EventSync)

	_, err = NewTorchShare(raw, 0, 1, []byte("/torch_1_2"), 0, nil, false)
	assert.NoError(t, err, "no event when none is to be waited for")
	for _, e := range [][]byte{nil, ev[:63], append(ev, 0)} {
		_, err = NewTorchShare(raw, 0, 1, []byte("/torch_1_2"), 0, e, true)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "event of %d bytes", len(e))
	}
	_, err = NewTorchShare(raw, 0, 1, []byte("/torch_1_2"), torchRefMaxCounters, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = NewTorchShare(raw, 0, 0, []byte("/torch_1_2"), 0, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "ipc.NewTorchShare")
}
