package dlpack

import (
	"errors"
	"fmt"
	"strings"
)

// What is known of the memory behind a foreign address, without a Go
// load or store from it (which would crash the process where it faults):
// the types below are what the platform's probes (platform_*.go) report.

// perm is a set of mapping permissions, as /proc/self/maps shows them.
type perm uint8

const (
	permRead perm = 1 << iota
	permWrite
	permExec
)

// errNoMaps: the process's mappings could not be read or parsed (no
// /proc in a chroot or sandbox, or another system), so nothing is known
// of a range's permissions.
var errNoMaps = errors.New("/proc/self/maps is not available")

// mapError is the first address of a range that has no mapping, or lies
// in a mapping without the permissions asked for.
type mapError struct {
	addr    uintptr
	lo, hi  uintptr // the mapping's bounds, when there is one
	perms   string  // its permissions as the maps file shows them ("r--p")
	missing perm    // what it lacks; 0 when nothing is mapped at addr
}

func (e *mapError) Error() string {
	if e.missing == 0 {
		return fmt.Sprintf("nothing is mapped at %#x", e.addr)
	}
	var lacks []string
	for _, p := range []struct {
		bit  perm
		name string
	}{{permRead, "read"}, {permWrite, "write"}, {permExec, "execute"}} {
		if e.missing&p.bit != 0 {
			lacks = append(lacks, p.name)
		}
	}
	return fmt.Sprintf("%#x is in the mapping %#x-%#x (%s), without %s permission", e.addr, e.lo, e.hi, e.perms, strings.Join(lacks, " and "))
}

// pageError is the first page of a range that cannot be read.
type pageError struct {
	addr uintptr
	err  error
}

func (e *pageError) Error() string {
	return fmt.Sprintf("the page at %#x cannot be read (%v)", e.addr, e.err)
}

func (e *pageError) Unwrap() error { return e.err }
