package resource_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

func TestPoolErrNilAndZero(t *testing.T) {
	_, err := (*resource.DevicePool)(nil).PoolErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = (&resource.DevicePool{}).PoolErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = (*resource.PinnedPool)(nil).PoolErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = (&resource.PinnedPool{}).PoolErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// A closed pool's handle is not handed out: Pool gives the zero MemPool,
// PoolErr says ErrClosed.
func TestInteropPoolErrClosed(t *testing.T) {
	dev := cudatest.Device(t)
	mr, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{MaxSize: 32 << 20})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	p, err := mr.PoolErr()
	require.NoError(t, err)
	assert.Equal(t, mr.Pool(), p)
	assert.False(t, p.IsZero())
	require.NoError(t, mr.Close())
	assert.True(t, mr.Pool().IsZero())
	_, err = mr.PoolErr()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), "DevicePool.PoolErr")
}
