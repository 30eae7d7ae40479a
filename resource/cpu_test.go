package resource_test

// Tests that need no driver: argument checks, nil and zero values, and
// error messages.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

func TestNilDevice(t *testing.T) {
	for _, tc := range []struct {
		op  string
		err error
	}{
		{"CurrentDevicePool", func() error { _, err := resource.CurrentDevicePool(nil); return err }()},
		{"NewDevicePool", func() error { _, err := resource.NewDevicePool(nil, &resource.DevicePoolOptions{}); return err }()},
		{"NewManaged", func() error { _, err := resource.NewManaged(nil, nil); return err }()},
		{"NewSyncDevice", func() error { _, err := resource.NewSyncDevice(nil); return err }()},
		{"Default", func() error { _, err := resource.Default(nil); return err }()},
		{"SetDefault", resource.SetDefault(nil, &resource.SyncDevice{})},
	} {
		require.ErrorIs(t, tc.err, cuda.ErrInvalidArgument, tc.op)
		assert.Equal(t, tc.op+": cuda: invalid argument: nil device", tc.err.Error())
	}
}

// TestNilAndZeroResources: methods on nil pointers and zero values return
// errors (or harmless answers) instead of panicking.
func TestNilAndZeroResources(t *testing.T) {
	for _, tc := range []struct {
		name string
		mr   buffer.MemoryResource
		kind string
	}{
		{"nil DevicePool", (*resource.DevicePool)(nil), "DevicePool"},
		{"zero DevicePool", &resource.DevicePool{}, "DevicePool"},
		{"nil PinnedPool", (*resource.PinnedPool)(nil), "PinnedPool"},
		{"zero PinnedPool", &resource.PinnedPool{}, "PinnedPool"},
		{"nil LegacyPinned", (*resource.LegacyPinned)(nil), "LegacyPinned"},
		{"zero LegacyPinned", &resource.LegacyPinned{}, "LegacyPinned"},
		{"nil Managed", (*resource.Managed)(nil), "Managed"},
		{"zero Managed", &resource.Managed{}, "Managed"},
		{"nil SyncDevice", (*resource.SyncDevice)(nil), "SyncDevice"},
		{"zero SyncDevice", &resource.SyncDevice{}, "SyncDevice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, size := range []uint64{0, 1024, 1 << 62} {
				b, err := buffer.Allocate(tc.mr, size, nil)
				assert.Nil(t, b)
				require.ErrorIs(t, err, cuda.ErrInvalidArgument)
				assert.Contains(t, err.Error(), tc.kind+".Allocate")
			}
			assert.NoError(t, tc.mr.Deallocate(0, 0, nil), "freeing address 0 does nothing")
			err := tc.mr.Deallocate(0x1000, 64, nil)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.kind+".Deallocate")
			assert.True(t, tc.mr.DeviceAccessible())
			_ = tc.mr.HostAccessible()
			assert.Equal(t, -1, tc.mr.DeviceID())
			assert.NotEmpty(t, tc.mr.(interface{ String() string }).String())
			if c, ok := tc.mr.(interface{ Close() error }); ok {
				assert.NoError(t, c.Close())
			}
		})
	}

	var pools = []struct {
		name string
		p    *resource.DevicePool
	}{{"nil", nil}, {"zero", &resource.DevicePool{}}}
	for _, tc := range pools {
		p := tc.p
		_, err := p.Attributes()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, tc.name)
		assert.ErrorIs(t, p.SetReleaseThreshold(1), cuda.ErrInvalidArgument, tc.name)
		assert.ErrorIs(t, p.SetReuseAllowOpportunistic(true), cuda.ErrInvalidArgument, tc.name)
		assert.ErrorIs(t, p.SetReuseFollowEventDependencies(true), cuda.ErrInvalidArgument, tc.name)
		assert.ErrorIs(t, p.SetReuseAllowInternalDependencies(true), cuda.ErrInvalidArgument, tc.name)
		assert.ErrorIs(t, p.ResetHighWatermarks(), cuda.ErrInvalidArgument, tc.name)
		assert.ErrorIs(t, p.Trim(0), cuda.ErrInvalidArgument, tc.name)
		assert.ErrorIs(t, p.SetPeerAccess(), cuda.ErrInvalidArgument, tc.name)
		_, err = p.PeerAccess()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, tc.name)
		assert.True(t, p.Pool().IsZero())
		assert.Nil(t, p.Device())
		assert.False(t, p.IsOwned())
		assert.False(t, p.IsIPCEnabled())
	}
	var pp *resource.PinnedPool
	_, err := pp.Attributes()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorIs(t, pp.Trim(0), cuda.ErrInvalidArgument)
	assert.ErrorIs(t, (&resource.PinnedPool{}).SetReleaseThreshold(0), cuda.ErrInvalidArgument)
	assert.ErrorIs(t, (&resource.PinnedPool{}).ResetHighWatermarks(), cuda.ErrInvalidArgument)
	assert.Equal(t, cuda.MemLocation{}, pp.Location())
}

func TestPinnedPoolBadNUMANode(t *testing.T) {
	node := -2
	_, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{NUMANode: &node})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, "NewPinnedPool: cuda: invalid argument: negative NUMANode -2 (leave it nil for plain host memory)", err.Error())
}

func TestPrefetchAdviseArguments(t *testing.T) {
	err := resource.Prefetch(nil, hostLoc, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, "Prefetch: cuda: invalid argument: nil buffer", err.Error())

	err = resource.Prefetch(buffer.FromPointer(0x1000, 64), cuda.MemLocation{Type: 9, ID: 1}, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "location type 9")

	closed := buffer.FromPointer(0x1000, 64)
	require.NoError(t, closed.Close())
	require.ErrorIs(t, resource.Prefetch(closed, hostLoc, nil), cuda.ErrClosed)
	require.ErrorIs(t, resource.Advise(closed, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}), cuda.ErrClosed)

	empty := buffer.FromPointer(0, 0)
	assert.NoError(t, resource.Prefetch(empty, hostLoc, nil), "nothing to move")
	assert.NoError(t, resource.Advise(empty, cuda.MemAdviseSetReadMostly, cuda.MemLocation{}))

	err = resource.Advise(empty, cuda.MemAdvice(42), hostLoc)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, "Advise: cuda: invalid argument: unknown advice 42", err.Error())
	err = resource.Advise(empty, cuda.MemAdviseSetPreferredLocation, cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: -1})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "SetPreferredLocation location: negative NUMA node -1")
	assert.NoError(t, resource.Advise(empty, cuda.MemAdviseUnsetPreferredLocation, cuda.MemLocation{}),
		"the location of UnsetPreferredLocation is ignored")
}
