package asleep

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// span is one sleeping range, [lo, hi), and the error its uses get.
type span struct {
	lo, hi uint64
	err    error
}

var (
	mu    sync.Mutex             // serializes writers
	spans atomic.Pointer[[]span] // nil while nothing is asleep; sorted by lo, disjoint
)

// Add registers [ptr, ptr+size) as asleep: until Remove, Check of any
// range overlapping it returns err. Ranges of live allocations never
// overlap, so neither do the registered ones; size 0 is ignored.
func Add(ptr, size uint64, err error) {
	if size == 0 {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	var cur []span
	if p := spans.Load(); p != nil {
		cur = *p
	}
	next := make([]span, 0, len(cur)+1)
	next = append(next, cur...)
	i, _ := slices.BinarySearchFunc(next, ptr, func(s span, p uint64) int { return cmp.Compare(s.lo, p) })
	next = slices.Insert(next, i, span{lo: ptr, hi: ptr + size, err: err})
	spans.Store(&next)
}

// Remove drops the range registered at ptr, if any.
func Remove(ptr uint64) {
	mu.Lock()
	defer mu.Unlock()
	p := spans.Load()
	if p == nil {
		return
	}
	i, found := slices.BinarySearchFunc(*p, ptr, func(s span, p uint64) int { return cmp.Compare(s.lo, p) })
	if !found {
		return
	}
	if len(*p) == 1 {
		spans.Store(nil)
		return
	}
	next := slices.Delete(slices.Clone(*p), i, i+1)
	spans.Store(&next)
}

// Check returns the error of a sleeping range that [ptr, ptr+size)
// overlaps (a range of size 0 overlaps one that contains ptr), or nil.
func Check(ptr, size uint64) error {
	if spans.Load() == nil {
		return nil // inlined into every Buffer call: one atomic load
	}
	return checkSlow(ptr, size)
}

func checkSlow(ptr, size uint64) error {
	p := spans.Load()
	if p == nil {
		return nil
	}
	return check(*p, ptr, size)
}

func check(s []span, ptr, size uint64) error {
	end := ptr + size
	if size == 0 {
		end = ptr + 1
	}
	if end <= ptr {
		end = math.MaxUint64 // past the top of the address space: all of it
	}
	// The last range starting before end is the only candidate: the
	// ranges are disjoint and sorted, so any earlier one ends before it
	// starts.
	i, _ := slices.BinarySearchFunc(s, end, func(sp span, e uint64) int { return cmp.Compare(sp.lo, e) })
	if i == 0 {
		return nil
	}
	if c := s[i-1]; c.hi > ptr {
		return c.err
	}
	return nil
}

// Any reports whether some range is asleep.
func Any() bool { return spans.Load() != nil }
