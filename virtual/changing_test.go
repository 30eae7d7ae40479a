package virtual

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// A call that got past its Buffer's checks before a Sleep, Wake, Grow or
// Shrink claimed the allocation (or before a Sleep released it) is
// refused under r.mu, not run on memory the claim is changing: Info,
// Export, AllocationProperties and another Grow (SetPeerAccess takes the
// same path, useLive). The
// window is played by setting the allocation's state directly, as the
// claim and the commit would between the caller's checks and r.mu.
func TestCallsRefuseChangingAllocation(t *testing.T) {
	r, f := newFakeResource(t, testGran, &Options{})
	b, err := r.Allocate(testGran, nil)
	require.NoError(t, err)
	a := r.allocs[b.Ptr()]
	require.NotNil(t, a)
	calls := map[string]func() error{
		"Info":                 func() error { _, err := r.Info(b); return err },
		"Export":               func() error { _, err := r.Export(b); return err },
		"AllocationProperties": func() error { _, err := r.AllocationProperties(b); return err },
		"Grow":                 func() error { _, err := r.Grow(b, 2*testGran); return err },
	}
	for _, state := range []string{"claimed", "asleep"} {
		r.mu.Lock()
		switch state {
		case "claimed":
			a.claimed = true
		case "asleep":
			a.sleep = &slept{}
		}
		r.mu.Unlock()
		for name, call := range calls {
			err := call()
			require.Error(t, err, "%s while %s", name, state)
			if state == "asleep" {
				assert.ErrorIs(t, err, ErrAsleep, "%s while asleep", name)
				var ae *AsleepError
				require.True(t, errors.As(err, &ae), "%s: %v", name, err)
				assert.Equal(t, b.Ptr(), ae.Addr)
			} else {
				assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "%s while claimed", name)
				assert.ErrorContains(t, err, "being changed by another call")
			}
		}
		r.mu.Lock()
		a.claimed, a.sleep = false, nil
		r.mu.Unlock()
	}
	// Unclaimed and awake, the same calls work again.
	_, err = r.Info(b)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	checkInvariants(t, r, f)
}
