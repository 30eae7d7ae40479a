//go:build linux

package probe

import (
	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"testing"

	"github.com/cudamem/cudamem/resource"
)

// A synchronous resource takes a closed stream at Allocate and records it;
// the buffer's Close then fails on it forever.
func TestSyncAllocateClosedStreamThenClose(t *testing.T) {
	defer baseline(t)()
	d0 := dev(t, 0)
	sd, _ := resource.NewSyncDevice(d0)
	mg, _ := resource.NewManaged(d0, nil)
	lp, _ := resource.NewLegacyPinned()
	for name, mr := range map[string]interface {
		Allocate(uint64, *cudaStream) (*bufferT, error)
	}{"sync": sd, "managed": mg, "legacypinned": lp} {
		s, err := d0.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		b, err := mr.Allocate(64, s)
		if err != nil {
			continue // fixed: refused up front
		}
		t.Errorf("%s.Allocate(64, closed stream): no error", name)
		if err := b.Close(); err != nil {
			t.Errorf("%s: then Close: %v", name, err)
			if err := b.CloseOn(d0.DefaultStream()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

type cudaStream = cuda.Stream
type bufferT = buffer.Buffer
