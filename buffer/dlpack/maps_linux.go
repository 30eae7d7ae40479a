//go:build linux && (amd64 || arm64)

package dlpack

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// coverRange walks the lines of a /proc/<pid>/maps file (ascending
// "lo-hi perms offset dev inode path" lines) and reports whether they
// cover [addr, addr+n) without a gap, each with the permissions need.
func coverRange(r *bufio.Reader, addr, n uintptr, need perm) error {
	if n == 0 {
		return nil
	}
	end := addr + n // the caller has checked that it does not wrap
	cur := addr
	for {
		line, err := r.ReadSlice('\n')
		if len(line) > 0 {
			lo, hi, perms, ok := parseMapsLine(line)
			if !ok {
				return fmt.Errorf("%w: a line reads %q", errNoMaps, line)
			}
			// A line longer than the buffer (a very long path): the
			// fields that matter came first; skip the rest.
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			if hi > cur {
				if lo > cur {
					return &mapError{addr: cur}
				}
				if missing := need &^ permsOf(perms); missing != 0 {
					return &mapError{addr: cur, lo: lo, hi: hi, perms: perms, missing: missing}
				}
				if hi >= end {
					return nil
				}
				cur = hi
			}
		}
		if err == io.EOF {
			return &mapError{addr: cur}
		}
		if err != nil {
			return fmt.Errorf("%w (%v)", errNoMaps, err)
		}
	}
}

// parseMapsLine reads the bounds and permissions of one maps line.
func parseMapsLine(line []byte) (lo, hi uintptr, perms string, ok bool) {
	rng, rest, found := strings.Cut(string(line), " ")
	if !found || len(rest) < 4 {
		return 0, 0, "", false
	}
	los, his, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, "", false
	}
	l, err1 := strconv.ParseUint(los, 16, 64)
	h, err2 := strconv.ParseUint(his, 16, 64)
	if err1 != nil || err2 != nil || h < l || uint64(uintptr(h)) != h {
		return 0, 0, "", false
	}
	return uintptr(l), uintptr(h), rest[:4], true
}

func permsOf(s string) perm {
	var p perm
	if s[0] == 'r' {
		p |= permRead
	}
	if s[1] == 'w' {
		p |= permWrite
	}
	if s[2] == 'x' {
		p |= permExec
	}
	return p
}
