package testutil

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// OpenFDs lists this process's open file descriptors with the file each
// refers to, from /proc/self/fd, leaving out the one the listing itself
// uses and any closed while it ran. It is nil where /proc/self/fd cannot
// be read (outside Linux), so callers can tell "cannot check" from "none".
func OpenFDs() map[int]string {
	const dir = "/proc/self/fd"
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil
	}
	out := make(map[int]string, len(names))
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd == int(f.Fd()) {
			continue
		}
		target, err := os.Readlink(dir + "/" + n)
		if err != nil {
			continue // closed between the listing and now
		}
		out[fd] = target
	}
	return out
}

// FDs is OpenFDs for a test that needs the list: it skips the test where
// the descriptors cannot be listed.
func FDs(t testing.TB) map[int]string {
	t.Helper()
	fds := OpenFDs()
	if fds == nil {
		t.Skip("cannot list file descriptors without /proc/self/fd")
	}
	return fds
}

// NewFDs returns, sorted, "fd -> file" for each descriptor in after that
// was not open, to the same file, in before. Descriptors that went away
// are not reported: the garbage collector's os.File finalizers close
// files that earlier tests dropped at any moment, so leak checks compare
// sets, never counts.
func NewFDs(before, after map[int]string) []string {
	var added []string
	for fd, target := range after {
		if old, ok := before[fd]; !ok || old != target {
			added = append(added, fmt.Sprintf("%d -> %s", fd, target))
		}
	}
	sort.Strings(added)
	return added
}

// AssertNoNewFDs fails the test if a descriptor is open now that was not
// open, to the same file, in before (a list from OpenFDs or FDs), with
// msgAndArgs as testify's assertions take them. A nil before (no listing
// possible) checks nothing. It reports whether the check passed.
func AssertNoNewFDs(t testing.TB, before map[int]string, msgAndArgs ...any) bool {
	t.Helper()
	if before == nil {
		return true
	}
	return assert.Empty(t, NewFDs(before, OpenFDs()), msgAndArgs...)
}
