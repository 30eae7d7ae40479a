package soundness_test

import (
	"fmt"
	"syscall"
)

// fdDiff describes descriptors closed, replaced or opened between two
// snapshots, or returns "".
func fdDiff(before, after map[int]string) string {
	var s string
	for fd, was := range before {
		now, ok := after[fd]
		switch {
		case !ok:
			s += fmt.Sprintf(" closed fd %d (%s);", fd, was)
		case now != was:
			s += fmt.Sprintf(" fd %d now %s, was %s;", fd, now, was)
		}
	}
	for fd, now := range after {
		if _, ok := before[fd]; !ok {
			s += fmt.Sprintf(" opened fd %d (%s);", fd, now)
		}
	}
	return s
}

// stdFDs keeps duplicates of stdin, stdout and stderr so a call that
// closes one of them (a bug the sweep exists to find) cannot take the test
// binary's output with it.
type stdFDs [3]int

func saveStdFDs() (s stdFDs, err error) {
	for i := range s {
		if s[i], err = syscall.Dup(i); err != nil {
			return s, err
		}
		syscall.CloseOnExec(s[i])
	}
	return s, nil
}

// restore puts back any standard descriptor that was closed or replaced.
func (s stdFDs) restore(before, after map[int]string) {
	for i := range s {
		if after[i] != before[i] {
			_ = syscall.Dup3(s[i], i, 0)
		}
	}
}

func (s stdFDs) close() {
	for _, fd := range s {
		syscall.Close(fd)
	}
}
