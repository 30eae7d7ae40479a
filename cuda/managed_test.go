package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The location constructors name what cuda.core's Device, Host(),
// Host(numa_id=N) and Host.numa_current() name, and read well in
// messages.
func TestLocationConstructors(t *testing.T) {
	for _, tc := range []struct {
		loc  MemLocation
		want MemLocation
		str  string
	}{
		{DeviceLocation(nil), MemLocation{Type: MemLocationTypeDevice, ID: -1}, "GPU -1"},
		{DeviceLocation(&Device{}), MemLocation{Type: MemLocationTypeDevice, ID: -1}, "GPU -1"},
		{HostLocation(), MemLocation{Type: MemLocationTypeHost}, "host"},
		{HostNUMALocation(3), MemLocation{Type: MemLocationTypeHostNUMA, ID: 3}, "host NUMA node 3"},
		{HostNUMACurrentLocation(), MemLocation{Type: MemLocationTypeHostNUMACurrent}, "host NUMA node of the calling thread"},
		{MemLocation{}, MemLocation{}, "no location"},
		{MemLocation{Type: 9, ID: 2}, MemLocation{Type: 9, ID: 2}, "location type 9 (id 2)"},
	} {
		assert.Equal(t, tc.want, tc.loc)
		assert.Equal(t, tc.str, tc.loc.String())
		assert.Equal(t, tc.str == "no location", tc.loc.IsZero(), tc.str)
	}
}

// A range attribute pair becomes a location; the ID counts only where it
// names something.
func TestRangeLocation(t *testing.T) {
	assert.Equal(t, MemLocation{Type: MemLocationTypeDevice, ID: 1}, rangeLocation(1, 1))
	assert.Equal(t, HostLocation(), rangeLocation(2, 7))
	assert.Equal(t, HostNUMALocation(2), rangeLocation(3, 2))
	assert.Equal(t, MemLocation{}, rangeLocation(0, 5), "none, or pages that disagree")
	assert.Equal(t, MemLocation{}, rangeLocation(42, 5))
}

// The batched prefetch and discard check their arguments before the
// stream, so these run without a driver; the stream (nil here) is what
// fails when they pass.
func TestManagedBatchChecks(t *testing.T) {
	var s *Stream
	p := []DevicePtr{0x1000, 0x9000}
	z := []uint64{4096, 4096}
	host := []MemLocation{HostLocation()}
	for _, tc := range []struct {
		name string
		err  error
		msg  string
	}{
		{"lengths", s.MemDiscardBatchAsync(p, z[:1]), "ptrs and sizes differ in length (2 and 1)"},
		{"empty", s.MemDiscardBatchAsync(nil, nil), "empty batch"},
		{"null", s.MemDiscardBatchAsync([]DevicePtr{0x1000, 0}, z), "Stream.MemDiscardBatchAsync: cuda: invalid argument: range 1 of 2: null or empty (0x0, 4096 bytes)"},
		{"zero size", s.MemPrefetchBatchAsync(p, []uint64{1, 0}, host, []uint64{0}), "range 1 of 2: null or empty (0x9000, 0 bytes)"},
		{"wraps", s.MemDiscardBatchAsync([]DevicePtr{^DevicePtr(0) - 1}, []uint64{4}), "wraps past 2^64"},
		{"no locs", s.MemPrefetchBatchAsync(p, z, nil, nil), "no location for a batch of 2 ranges"},
		{"locs lengths", s.MemPrefetchBatchAsync(p, z, host, nil), "locs and locIdxs differ in length (1 and 0)"},
		{"too many locs", s.MemPrefetchBatchAsync(p[:1], z[:1], []MemLocation{HostLocation(), HostLocation()}, []uint64{0, 1}), "2 locations for 1 ranges"},
		{"first index", s.MemDiscardAndPrefetchBatchAsync(p, z, host, []uint64{1}), "locIdxs[0] is 1"},
		{"order", s.MemPrefetchBatchAsync(p, z, []MemLocation{HostLocation(), HostLocation()}, []uint64{0, 0}), "locIdxs[1] = 0 does not follow locIdxs[0] = 0"},
		{"past the end", s.MemPrefetchBatchAsync(p, z, []MemLocation{HostLocation(), HostLocation()}, []uint64{0, 2}), "locIdxs[1] = 2 is past the last range (2 ranges)"},
		{"bad location", s.MemPrefetchBatchAsync(p, z, []MemLocation{{}}, []uint64{0}), "locs[0] is no location"},
	} {
		require.ErrorIs(t, tc.err, ErrInvalidArgument, tc.name)
		assert.Contains(t, tc.err.Error(), tc.msg, tc.name)
	}
	err := s.MemPrefetchBatchAsync(p, z, host, []uint64{0})
	require.Error(t, err, "well-formed: the nil stream is what fails")
	assert.NotContains(t, err.Error(), "range")
}
