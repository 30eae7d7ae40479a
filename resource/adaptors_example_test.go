package resource_test

import (
	"fmt"
	"log"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// arena is a resource of one's own: it hands out ranges of an address
// range it manages. Here the range is made up and never touched, so the
// example runs without a GPU; a real one would carve device memory. Like
// every buffer.MemoryResource it hands out addresses (AllocatePtr), so
// the adaptors above it pass addresses up and only the top one builds a
// Buffer.
type arena struct {
	mu   sync.Mutex
	next cuda.DevicePtr
	live map[cuda.DevicePtr]uint64
}

func (r *arena) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if size == 0 {
		return 0, s, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.next
	r.next += cuda.DevicePtr((size + 255) &^ 255)
	r.live[p] = size
	return p, s, nil
}

func (r *arena) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

func (r *arena) Deallocate(p cuda.DevicePtr, size uint64, _ *cuda.Stream) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live[p] != size {
		return cuda.Errorf("arena.Deallocate", cuda.ErrInvalidArgument, "%#x (%d bytes) is not live", uint64(p), size)
	}
	delete(r.live, p)
	return nil
}

func (r *arena) DeviceAccessible() bool { return true }
func (r *arena) HostAccessible() bool   { return false }
func (r *arena) DeviceID() int          { return 0 }

// A stack of adaptors: a 1 MiB budget, counted, with a record of what is
// live. Each Allocate goes down the stack as a bare address and comes
// back as one Buffer, owned by the top (Tracking); its Close goes down
// through every layer's books to the arena.
func ExampleNewTracking_stack() {
	up := &arena{next: 0x7f0000000000, live: map[cuda.DevicePtr]uint64{}}
	lim := resource.NewLimiting(up, 1<<20)
	stats := resource.NewStatistics(lim)
	mr := resource.NewTracking(stats, nil)

	var bufs []*buffer.Buffer
	for _, size := range []uint64{256 << 10, 512 << 10, 512 << 10} {
		b, err := mr.Allocate(size, nil)
		if err != nil {
			fmt.Println("refused:", err) // the third is over the budget
			continue
		}
		bufs = append(bufs, b)
	}
	fmt.Println(mr.LiveCount(), "live,", lim.Used(), "bytes of", lim.Limit())
	fmt.Println(bufs[0].Resource() == buffer.MemoryResource(mr), "(the top owns the Buffer)")
	for _, b := range bufs {
		if err := b.Close(); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(stats.Stats())
	fmt.Println(mr.LiveCount(), "live,", lim.Used(), "bytes,", len(up.live), "in the arena")
	// Output:
	// refused: Limiting.Allocate: 524288 bytes would exceed the limit of 1048576 bytes (786432 in use): CUDA_ERROR_OUT_OF_MEMORY
	// 2 live, 786432 bytes of 1048576
	// true (the top owns the Buffer)
	// current 0 bytes in 0 allocations, peak 786432 bytes / 2 allocations, total 786432 bytes in 2 allocations, 1 failures
	// 0 live, 0 bytes, 0 in the arena
}
