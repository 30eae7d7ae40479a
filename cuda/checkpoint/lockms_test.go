package checkpoint

import (
	"math"
	"testing"
	"time"
)

// A Lock timeout reaches the driver in whole milliseconds, rounded up, so
// that a sub-millisecond one stays a timeout: 0 would mean none.
func TestLockMs(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint32
	}{
		{0, 0}, {time.Nanosecond, 1}, {time.Millisecond, 1}, {time.Millisecond + 1, 2},
		{time.Second, 1000}, {math.MaxUint32 * time.Millisecond, math.MaxUint32},
	} {
		if got := lockMs(c.d); got != c.want {
			t.Errorf("lockMs(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
