package resource_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// Options are checked before the device or the driver: these run on any
// machine.
func TestManagedPoolOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		opts resource.ManagedPoolOptions
		msg  string
	}{
		{resource.ManagedPoolOptions{InitialReserve: 2 * mib, ReleaseThreshold: mib},
			"NewManagedPool: cuda: invalid argument: InitialReserve 2097152 exceeds ReleaseThreshold 1048576: the pool would release the reserve at the next synchronization"},
		{resource.ManagedPoolOptions{PreferredLocation: cuda.HostNUMALocation(-2)},
			"NewManagedPool: cuda: invalid argument: PreferredLocation: negative NUMA node -2"},
		{resource.ManagedPoolOptions{PreferredLocation: cuda.MemLocation{Type: 9}},
			"NewManagedPool: cuda: invalid argument: PreferredLocation: location type 9 (id 0) is not a device, host or host NUMA location"},
		{resource.ManagedPoolOptions{}, "NewManagedPool: cuda: invalid argument: nil device"},
	} {
		_, err := resource.NewManagedPool(nil, &tc.opts)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, tc.msg)
		assert.Equal(t, tc.msg, err.Error())
	}
}

// The batches refuse what is wrong with their arguments as a whole before
// they look at a buffer, so these run on any machine: no buffers, a
// number of locations that is neither one nor the buffers' (cuda.core's
// test_batch_length_mismatch), no location, no stream, a zero stream.
func TestManagedBatchArgumentsRefused(t *testing.T) {
	two := []*buffer.Buffer{nil, nil}
	host := []cuda.MemLocation{cuda.HostLocation()}
	zero := new(cuda.Stream)
	for _, tc := range []struct {
		err error
		msg string
	}{
		{resource.PrefetchBatch(nil, host, zero), "PrefetchBatch: cuda: invalid argument: empty batch: no buffers"},
		{resource.DiscardBatch([]*buffer.Buffer{}, zero), "DiscardBatch: cuda: invalid argument: empty batch: no buffers"},
		{resource.PrefetchBatch(two, []cuda.MemLocation{cuda.HostLocation(), cuda.HostLocation(), cuda.HostLocation()}, zero),
			"PrefetchBatch: cuda: invalid argument: 3 locations for 2 buffers: the length must be 1 (one location for all) or the number of buffers"},
		{resource.DiscardPrefetchBatch(two, nil, zero),
			"DiscardPrefetchBatch: cuda: invalid argument: 0 locations for 2 buffers: the length must be 1 (one location for all) or the number of buffers"},
		{resource.DiscardPrefetch(nil, cuda.MemLocation{}, zero), "DiscardPrefetch: cuda: invalid argument: location 0: a location is required"},
		{resource.PrefetchBatch(two, host, nil), "PrefetchBatch: cuda: invalid argument: nil stream: the driver's batched prefetch and discard refuse the legacy default stream"},
		{resource.Discard(nil, zero), "Discard: cuda: invalid argument: nil or zero stream"},
	} {
		require.ErrorIs(t, tc.err, cuda.ErrInvalidArgument, tc.msg)
		assert.Contains(t, tc.err.Error(), tc.msg)
	}
}
