package resource

import (
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// BenchmarkSubAllocatorPtrPairFake: AllocatePtr + Deallocate through the
// buffer.MemoryResource interface on one stream over the fake upstream,
// the address pair that BenchmarkSubAllocatorPairFake/256B wraps in a
// Buffer (whose "core" skips the interface and AllocatePtr's checks).
// Run them together to compare:
//
//	go test -run '^$' -bench 'SubAllocatorPtrPairFake|SubAllocatorPairFake/(256B|core)' ./resource
func BenchmarkSubAllocatorPtrPairFake(b *testing.B) {
	a, _, _ := newSA(b, nil)
	defer a.Close()
	var mr buffer.MemoryResource = a
	s := new(cuda.Stream)
	b.ReportAllocs()
	for b.Loop() {
		p, _, err := mr.AllocatePtr(256, s)
		if err != nil {
			b.Fatal(err)
		}
		if err := mr.Deallocate(p, 256, s); err != nil {
			b.Fatal(err)
		}
	}
}
