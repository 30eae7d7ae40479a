package asleep

import (
	"errors"
	"testing"
)

func TestCheckOverlaps(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	Add(0x1000, 0x1000, a) // [0x1000, 0x2000)
	Add(0x3000, 0x100, b)  // [0x3000, 0x3100)
	Add(0x5000, 0, b)      // ignored
	defer func() { Remove(0x1000); Remove(0x3000) }()
	for _, c := range []struct {
		ptr, size uint64
		want      error
		orB       bool // b is as right as want: the range overlaps both
	}{
		{0x0, 0x1000, nil, false},    // ends where a starts
		{0x0, 0x1001, a, false},      // one byte into a
		{0x1000, 0, a, false},        // size 0 inside a
		{0x1fff, 1, a, false},        // a's last byte
		{0x2000, 0x1000, nil, false}, // between
		{0x2000, 0x1001, b, false},   // reaches b
		{0x1800, 0x2000, a, true},    // over a's end and b's start: one of them
		{0x3100, 10, nil, false},     // after b
		{0x5000, 1, nil, false},      // the size-0 range was not added
		{^uint64(0) - 1, 5, nil, false},
		{0x2000, ^uint64(0) - 0x1000, b, false}, // a size that wraps reaches to the top, over b
	} {
		if got := Check(c.ptr, c.size); got != c.want && !(c.orB && got == b) {
			t.Errorf("Check(%#x, %#x) = %v, want %v", c.ptr, c.size, got, c.want)
		}
	}
	Remove(0x1000)
	if Check(0x1000, 1) != nil || Check(0x3000, 1) != b {
		t.Fatal("Remove dropped the wrong range")
	}
	Remove(0x3000)
	Remove(0x3000) // twice: nothing
	if Any() {
		t.Fatal("ranges left after removing them all")
	}
}
