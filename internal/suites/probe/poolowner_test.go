//go:build linux

package probe

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
)

// poolResource is what DevicePool and PinnedPool share for these tests.
type poolResource interface {
	buffer.MemoryResource
	Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error)
	Close() error
}

// A pool resource frees only addresses it handed out: another pool's
// pointer, an address freed already, and one never allocated are refused
// without calling the driver, and every pool and buffer involved closes
// cleanly afterwards. cuMemFreeAsync frees memory of any pool, so before
// this check A.Deallocate(B's pointer) freed B's memory, and A's live count
// dropped for it, so that A was destroyed while its own a2 was still live.
func TestPoolRefusesAddressesItDidNotHandOut(t *testing.T) {
	d0 := dev(t, 0)
	for _, kind := range []string{"DevicePool", "PinnedPool"} {
		t.Run(kind, func(t *testing.T) {
			newPool := func() poolResource {
				if kind == "DevicePool" {
					p, err := resource.NewDevicePool(d0, nil)
					require.NoError(t, err)
					return p
				}
				p, err := resource.NewPinnedPool(nil)
				require.NoError(t, err)
				return p
			}
			pools := fake.Snapshot()[fakecuda.Pools]
			a, b := newPool(), newPool()
			a1, err := a.Allocate(256, nil)
			require.NoError(t, err)
			a2, err := a.Allocate(256, nil)
			require.NoError(t, err)
			b1, err := b.Allocate(256, nil)
			require.NoError(t, err)

			allocs := fake.Stat(fakecuda.Allocs)
			err = a.Deallocate(b1.Ptr(), 256, nil)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument, "another pool's pointer")
			assert.Contains(t, err.Error(), kind+".Deallocate")
			assert.Contains(t, err.Error(), "not a live allocation of this "+kind)

			// A pointer from the pool's own pointer API, freed twice.
			p, ps, err := a.AllocatePtr(512, nil)
			require.NoError(t, err)
			require.NoError(t, a.Deallocate(p, 512, ps))
			assert.ErrorIs(t, a.Deallocate(p, 512, ps), cuda.ErrInvalidArgument, "freed already")
			// An address inside a live allocation is not an allocation.
			assert.ErrorIs(t, a.Deallocate(a1.Ptr()+16, 16, nil), cuda.ErrInvalidArgument)
			assert.Equal(t, allocs, fake.Stat(fakecuda.Allocs), "no refused free reached the driver: b1 is still allocated")

			// A Buffer's memory is the Buffer's to free: the pool refuses
			// it as a pointer.
			assert.ErrorIs(t, a.Deallocate(a1.Ptr(), 256, nil), cuda.ErrInvalidArgument, "a Buffer's memory")
			assert.Equal(t, allocs, fake.Stat(fakecuda.Allocs))

			// Disowned, it becomes a pointer the pool frees; wrapped again
			// with Owned, the new Buffer's Close frees it.
			c1, err := a.Allocate(1024, nil)
			require.NoError(t, err)
			cp, cn, err := c1.Disown()
			require.NoError(t, err)
			require.NoError(t, a.Deallocate(cp, cn, nil), "a disowned Buffer's memory")
			c2, err := a.Allocate(1024, nil)
			require.NoError(t, err)
			cp, cn, err = c2.Disown()
			require.NoError(t, err)
			require.NoError(t, buffer.Owned(cp, cn, a, nil).Close())
			q, qs, err := a.AllocatePtr(64, nil)
			require.NoError(t, err)
			require.NoError(t, buffer.Owned(q, 64, a, qs).Close(), "AllocatePtr's pointer in an Owned Buffer")
			assert.Equal(t, allocs, fake.Stat(fakecuda.Allocs), "each freed once")

			// Everything still closes, each pool destroyed after its last buffer.
			require.NoError(t, a.Close())
			require.NoError(t, a1.Close())
			assert.Equal(t, pools+2, fake.Snapshot()[fakecuda.Pools], "pool A lives while a2 does")
			require.NoError(t, a2.Close())
			require.NoError(t, b1.Close())
			require.NoError(t, b.Close())
			assert.Equal(t, pools, fake.Snapshot()[fakecuda.Pools], "both pools destroyed")
		})
	}
}

// A SubAllocator takes only streams a device made, and allocates only on
// streams of its upstream's device. A zero Stream's free used to be
// accepted: its range sat on a list no wait could order, so every Trim and
// Close failed and the block never went back. An allocation on another
// GPU's stream was refused or not depending on what that stream had freed.
func TestSubAllocatorAdmitsOnlyUsableStreams(t *testing.T) {
	d0, d1 := dev(t, 0), dev(t, 1)
	p, err := resource.NewDevicePool(d0, nil)
	require.NoError(t, err)
	a, err := resource.NewSubAllocator(p, nil)
	require.NoError(t, err)

	b, err := a.Allocate(4096, nil)
	require.NoError(t, err)
	err = b.CloseOn(new(cuda.Stream))
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "zero cuda.Stream")
	assert.False(t, b.IsClosed(), "still open, for a Close on a real stream")
	_, err = a.Allocate(64, new(cuda.Stream))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)

	// Another GPU's stream: refused for allocations, before and after a
	// free on it (frees may be ordered on any stream).
	s1 := d1.DefaultStream()
	_, err = a.Allocate(4096, s1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.NoError(t, b.CloseOn(s1))
	_, err = a.Allocate(4096, s1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "even with a range freed on that stream cached")

	require.NoError(t, a.Trim())
	assert.Zero(t, a.Stats().Reserved, "the block went back")
	require.NoError(t, a.Close())
	require.NoError(t, p.Close())
}
