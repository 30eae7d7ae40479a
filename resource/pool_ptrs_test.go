package resource

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cudamem/cudamem/cuda"
)

func TestPtrSet(t *testing.T) {
	var s ptrSet
	_, ok := s.take(0x1000)
	assert.False(t, ok, "empty")
	s.add(0x1000, 256)
	s.add(0x1200, 512)
	n, ok := s.take(0x1000)
	assert.True(t, ok)
	assert.Equal(t, uint64(256), n)
	_, ok = s.take(0x1000)
	assert.False(t, ok, "taken once")
	n, ok = s.take(0x1200)
	assert.True(t, ok)
	assert.Equal(t, uint64(512), n)

	// Concurrent adds and takes of distinct addresses each come back once.
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				p := cuda.DevicePtr(uint64(g)<<32 | uint64(i)<<9)
				s.add(p, uint64(i))
				n, ok := s.take(p)
				assert.True(t, ok)
				assert.Equal(t, uint64(i), n)
			}
		}()
	}
	wg.Wait()
	for i := range s.shards {
		assert.Empty(t, s.shards[i].m)
	}
}

// BenchmarkPtrSet is what the ownership check adds to a pool pair: "same"
// frees and allocates one address again (as a pool reuses its memory),
// "new" a new address each time, "held" with 10,000 others live.
func BenchmarkPtrSet(b *testing.B) {
	for _, c := range []struct {
		name       string
		step, held uint64
	}{{"same", 0, 0}, {"new", 512, 0}, {"held", 512, 10000}} {
		b.Run(c.name, func(b *testing.B) {
			var s ptrSet
			for i := range c.held {
				s.add(cuda.DevicePtr(0x100000000+i*4096), 1)
			}
			p := cuda.DevicePtr(0x7f0000000000)
			for b.Loop() {
				s.add(p, 256)
				s.take(p)
				p += cuda.DevicePtr(c.step)
			}
		})
	}
}
