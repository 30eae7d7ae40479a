package virtual

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// hookDriver runs a test's function once, at the first
// cuMemAddressReserve, cuMemCreate or stream wait made while it is armed:
// another goroutine's call on the buffer (a DLPack export taking a Hold,
// a Close) landing while a Grow or Shrink is under way.
type hookDriver struct {
	*fakeDriver
	onReserve, onCreate, onSync func()
}

func fire(f *func()) {
	if g := *f; g != nil {
		*f = nil
		g()
	}
}

func (h *hookDriver) MemAddressReserve(size, align uint64, hint cuda.DevicePtr) (cuda.DevicePtr, error) {
	fire(&h.onReserve)
	return h.fakeDriver.MemAddressReserve(size, align, hint)
}

func (h *hookDriver) MemCreate(size uint64, prop *cuda.MemAllocationProp) (cuda.MemHandle, error) {
	fire(&h.onCreate)
	return h.fakeDriver.MemCreate(size, prop)
}

func (h *hookDriver) syncStream(s *cuda.Stream) error {
	fire(&h.onSync)
	return h.fakeDriver.syncStream(s)
}

// requireWhole fails t unless b is open, at ptr, size bytes, and every
// byte of it is mapped in the fake driver.
func requireWhole(t *testing.T, r *Resource, f *fakeDriver, b *buffer.Buffer, ptr cuda.DevicePtr, size uint64) {
	t.Helper()
	require.False(t, b.IsClosed(), "b was closed")
	require.Equal(t, ptr, b.Ptr())
	require.Equal(t, size, b.Size())
	need, _ := roundUp(size, r.gran)
	_, ok := f.mappingsIn(ptr, need)
	require.True(t, ok, "b (%#x, %d bytes) is open over unmapped memory:\n%s", uint64(ptr), size, f.state())
	info, err := r.Info(b)
	require.NoError(t, err)
	require.Equal(t, size, info.Size)
}

// holdOn returns a function that takes a Hold of *b, as a DLPack export
// on another goroutine would, and stores it in *hold.
func holdOn(t *testing.T, b **buffer.Buffer, hold **buffer.Hold) func() {
	return func() {
		h, err := (*b).Hold("test")
		require.NoError(t, err)
		*hold = h
	}
}

// TestGrowRefusesHoldTakenDuring: Grow checks for Holds before its driver
// work, but one may be taken meanwhile. Grow used to move or extend the
// allocation first and only then find (in Disown) that it could not take
// b over: it returned (nil, err), documented as "nothing happened", while
// b stayed open over the unmapped old range and the moved allocation
// belonged to no buffer. Now the grow is undone: b is whole where it was,
// the new memory is given back, and once the Hold is released the grow
// works.
func TestGrowRefusesHoldTakenDuring(t *testing.T) {
	const g = 1 << 16
	for _, tc := range []struct {
		name string
		arm  func(h *hookDriver, take func())
		move bool
	}{
		{"move", func(h *hookDriver, take func()) { h.onReserve = take }, true},
		{"in place", func(h *hookDriver, take func()) { h.onCreate = take }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(g)
			h := &hookDriver{fakeDriver: f}
			r, err := newResource(h, fakeDevice, &Options{HandleType: HandleNone})
			require.NoError(t, err)
			b, err := r.Allocate(g, nil)
			require.NoError(t, err)
			ptr := b.Ptr()
			if tc.move {
				f.block(ptr+g, g) // the range after b is taken: Grow must move
			}
			before := snapshot(r, f)
			var hold *buffer.Hold
			tc.arm(h, holdOn(t, &b, &hold))
			nb, err := r.Grow(b, 4*g)
			require.NotNil(t, hold, "the hook did not run")
			require.Nil(t, nb)
			requireWhole(t, r, f, b, ptr, g)
			checkInvariants(t, r, f)
			require.Equal(t, before, snapshot(r, f), "the failed Grow left changes behind")
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			require.Contains(t, err.Error(), "Resource.Grow")
			require.Contains(t, err.Error(), "Hold")

			require.NoError(t, hold.Release())
			nb, err = r.Grow(b, 4*g)
			require.NoError(t, err)
			require.True(t, b.IsClosed())
			checkInvariants(t, r, f)
			closeAll(t, r, f, nb)
		})
	}
}

// TestShrinkRefusesHoldTakenDuring: the same for Shrink, which unmapped
// and released the tail and then failed to take b over, leaving it open
// at its old size over the unmapped tail. Shrink now takes b over before
// it unmaps anything: the Hold makes it fail with b whole.
func TestShrinkRefusesHoldTakenDuring(t *testing.T) {
	const g = 1 << 16
	f := newFake(g)
	h := &hookDriver{fakeDriver: f}
	r, err := newResource(h, fakeDevice, &Options{HandleType: HandleNone})
	require.NoError(t, err)
	b, err := r.Allocate(g, nil)
	require.NoError(t, err)
	b, err = r.Grow(b, 4*g) // in place: two chunks
	require.NoError(t, err)
	ptr := b.Ptr()
	before := snapshot(r, f)
	var hold *buffer.Hold
	h.onSync = holdOn(t, &b, &hold) // Shrink waits for b's stream before it unmaps
	nb, err := r.Shrink(b, g)
	require.NotNil(t, hold, "the hook did not run")
	require.Nil(t, nb)
	requireWhole(t, r, f, b, ptr, 4*g)
	checkInvariants(t, r, f)
	require.Equal(t, before, snapshot(r, f), "the failed Shrink left changes behind")
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.Contains(t, err.Error(), "Resource.Shrink")

	require.NoError(t, hold.Release())
	nb, err = r.Shrink(b, g)
	require.NoError(t, err)
	checkInvariants(t, r, f)
	closeAll(t, r, f, nb)
}

// TestResizeRefusesAccessChanges: while a Shrink (or Grow) owns an
// allocation, a SetPeerAccess is refused and changes nothing: it would
// miss the memory a Grow prepared. The resize then completes. (A Close
// meanwhile is not refused: see TestCloseDuringResizeFreesOnce.)
func TestResizeRefusesAccessChanges(t *testing.T) {
	const g = 1 << 16
	f := newFake(g)
	h := &hookDriver{fakeDriver: f}
	r, err := newResource(h, fakeDevice, &Options{HandleType: HandleNone, Peers: []*cuda.Device{fakePeer1}})
	require.NoError(t, err)
	b, err := r.Allocate(g, nil)
	require.NoError(t, err)
	b, err = r.Grow(b, 4*g)
	require.NoError(t, err)
	var accessErr error
	h.onSync = func() { accessErr = r.SetPeerAccess(b, ReadOnly, fakePeer1) }
	nb, err := r.Shrink(b, g)
	require.NoError(t, err)
	require.ErrorIs(t, accessErr, cuda.ErrInvalidArgument)
	require.Contains(t, accessErr.Error(), "being changed by another call")
	require.True(t, b.IsClosed(), "consumed by the Shrink")
	checkInvariants(t, r, f)
	acc, err := r.Access(nb, fakePeer1)
	require.NoError(t, err)
	require.Equal(t, ReadWrite, acc, "the refused SetPeerAccess changed the access")
	closeAll(t, r, f, nb)
}
