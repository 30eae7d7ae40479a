package buffer_test

import (
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// addrResource hands out one address over and over and frees nothing:
// the Buffer's own cost, with no resource work beside it.
type addrResource struct{}

func (addrResource) AllocatePtr(_ uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0x1000, s, nil
}
func (addrResource) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (addrResource) DeviceAccessible() bool                                { return true }
func (addrResource) HostAccessible() bool                                  { return false }
func (addrResource) DeviceID() int                                         { return noDevice }

// BenchmarkAllocateClose: buffer.Allocate + Buffer.Close over a resource
// that does nothing, what a Buffer adds to a resource's address pair
// ("ptr" is that pair alone, through the interface).
func BenchmarkAllocateClose(b *testing.B) {
	var mr buffer.MemoryResource = addrResource{}
	s := new(cuda.Stream)
	b.Run("buffer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, err := buffer.Allocate(mr, 256, s)
			if err != nil {
				b.Fatal(err)
			}
			if err := buf.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ptr", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, s, err := mr.AllocatePtr(256, s)
			if err != nil {
				b.Fatal(err)
			}
			if err := mr.Deallocate(p, 256, s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
