package resource

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// A pool's Buffers keep their memory out of the pool's record of plain
// pointers (ForBuffers): Deallocate refuses a live Buffer's address, the
// Buffer's Close frees it; Disown records the address, so that Deallocate
// then frees it, once. Both kinds of pool.
func TestPoolBuffersRecordOnlyDisownedFake(t *testing.T) {
	if !onFakeDriver(t) {
		return
	}
	dev, err := cuda.GetDevice(0)
	require.NoError(t, err)
	dp, err := NewDevicePool(dev, &DevicePoolOptions{})
	require.NoError(t, err)
	pp, err := NewPinnedPool(&PinnedPoolOptions{})
	require.NoError(t, err)
	for _, mr := range []buffer.MemoryResource{dp, pp} {
		b, err := buffer.Allocate(mr, 4096, nil)
		require.NoError(t, err)
		assert.Same(t, mr, b.Resource())
		err = mr.Deallocate(b.Ptr(), 4096, nil)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "%T: a live Buffer's memory is not a plain pointer", mr)
		require.NoError(t, b.Close())

		b, err = buffer.Allocate(mr, 4096, nil)
		require.NoError(t, err)
		p, n, err := b.Disown()
		require.NoError(t, err)
		require.NoError(t, mr.Deallocate(p, n, nil), "%T: a disowned Buffer's memory is the pool's plain pointer", mr)
		require.ErrorIs(t, mr.Deallocate(p, n, nil), cuda.ErrInvalidArgument, "freed once")
	}
	require.NoError(t, dev.Sync())
	for _, p := range []interface {
		Attributes() (PoolAttributes, error)
	}{dp, pp} {
		attrs, err := p.Attributes()
		require.NoError(t, err)
		assert.Zero(t, attrs.UsedMemCurrent, "everything back in the pool")
	}
	assert.NoError(t, dp.Close())
	assert.NoError(t, pp.Close())
}
