package resource

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// TestLocationCoerce is the twin of cuda.core's TestLocationCoerce: what
// the operations take as a location. Go's types settle at compile time
// what cuda.core checks at run time (an int or a string for a location:
// test_int_rejected, test_bad_type); what remains is the zero location
// (refused where one is required, accepted where it means "none") and
// location types no constructor makes.
func TestLocationCoerce(t *testing.T) {
	t.Run("device passthrough", func(t *testing.T) {
		loc := cuda.DeviceLocation(nil)
		assert.Equal(t, cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: -1}, loc)
		require.Error(t, checkLocation("op", "loc", loc), "no device -1")
		if dev, err := cuda.GetDevice(0); err == nil {
			loc := cuda.DeviceLocation(dev)
			assert.Equal(t, cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(dev.Ordinal())}, loc)
			assert.NoError(t, checkLocation("op", "loc", loc))
		}
	})
	for name, tc := range map[string]struct {
		loc  cuda.MemLocation
		want cuda.MemLocationType
		id   int32
	}{
		"host passthrough":              {cuda.HostLocation(), cuda.MemLocationTypeHost, 0},
		"host numa passthrough":         {cuda.HostNUMALocation(3), cuda.MemLocationTypeHostNUMA, 3},
		"host numa current passthrough": {cuda.HostNUMACurrentLocation(), cuda.MemLocationTypeHostNUMACurrent, 0},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.loc.Type)
			assert.Equal(t, tc.id, tc.loc.ID)
			assert.NoError(t, checkLocation("op", "loc", tc.loc))
		})
	}
	t.Run("none when disallowed", func(t *testing.T) {
		err := checkLocation("Prefetch", "target", cuda.MemLocation{})
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "Prefetch: cuda: invalid argument: target: a location is required")
	})
	t.Run("none when allowed", func(t *testing.T) {
		// A pool's preferred location may be none: the options pass, and
		// the refusal is about the missing device, not the location.
		_, err := NewManagedPool(nil, &ManagedPoolOptions{})
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Equal(t, "NewManagedPool: cuda: invalid argument: nil device", err.Error())
	})
	t.Run("bad type", func(t *testing.T) {
		err := checkLocation("op", "loc", cuda.MemLocation{Type: 7})
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "location type 7 (id 0) is not a device, host or host NUMA location")
	})
}
