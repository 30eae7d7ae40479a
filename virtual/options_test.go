package virtual

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

func TestOptionsRejectedByName(t *testing.T) {
	for _, tc := range []struct {
		opts   Options
		option string
	}{
		{Options{Location: OnHost, AllocationType: 7}, "AllocationType"},
		{Options{Location: 42}, "Location"},
		{Options{Location: OnHostNUMA, NUMANode: -2}, "NUMANode"},
		{Options{Location: OnHost, HandleType: 99}, "HandleType"},
		{Options{Location: OnHost, Granularity: 5}, "Granularity"},
		{Options{Location: OnHost, AddrAlign: 3 << 20}, "AddrAlign"},
		{Options{Location: OnHost, SelfAccess: 9}, "SelfAccess"},
		{Options{Location: OnHost, PeerAccess: -1}, "PeerAccess"},
		{Options{Location: OnHost, Peers: []*cuda.Device{nil}}, "Peers"},
		{Options{Location: OnHost, NUMANode: 3}, "NUMANode"},
		{Options{Location: OnHost, Peers: []*cuda.Device{fakeDevice}}, "Peers"},
		{Options{Location: OnHost, Peers: []*cuda.Device{fakePeer1, fakePeer2, fakePeer1}}, "Peers"},
	} {
		t.Run(tc.option, func(t *testing.T) {
			_, err := tc.opts.props(fakeDevice)
			require.Error(t, err)
			assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "option "+tc.option)
			assert.Contains(t, err.Error(), "virtual.New")
		})
	}
}

func TestOptionsWin32NotSupported(t *testing.T) {
	_, err := (&Options{Location: OnHost, HandleType: HandleWin32}).props(nil)
	assert.ErrorIs(t, err, cuda.ErrNotSupported)
}

func TestOptionsBuildProperties(t *testing.T) {
	p, err := (&Options{Location: OnHostNUMA, NUMANode: 1, GPUDirectRDMA: true, HandleType: HandleNone, AllocationType: Managed}).props(nil)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: 1}, p.Location)
	assert.Equal(t, uint8(1), p.AllocFlags.GPUDirectRDMACapable)
	assert.Equal(t, cuda.MemHandleTypeNone, p.RequestedHandleTypes)
	assert.Equal(t, cuda.MemAllocationTypeManaged, p.Type)
}

func TestNewNilDevice(t *testing.T) {
	_, err := New(nil, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestAccessString(t *testing.T) {
	assert.Equal(t, "read-write", ReadWrite.String())
	assert.Equal(t, "none", NoAccess.String())
	f, err := ReadOnly.flags()
	require.NoError(t, err)
	assert.Equal(t, cuda.MemAccessProtRead, f)
}

func TestZeroResourceRejected(t *testing.T) {
	for _, r := range []*Resource{nil, {}} {
		_, err := r.Allocate(1, nil)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		_, err = r.Import([]Chunk{{FD: 3, Size: 1}}, 1)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		_, err = r.Grow(nil, 1)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.ErrorIs(t, r.Deallocate(0x1000, 1, nil), cuda.ErrInvalidArgument)
	}
}

// TestNUMANodeOutOfRange: a node past int32 used to become another node
// (int32 truncation: 1<<32 became node 0).
func TestNUMANodeOutOfRange(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("int is 32 bits: no node can exceed the driver's range")
	}
	big := int(bigNUMA)
	_, err := (&Options{Location: OnHostNUMA, NUMANode: big}).props(fakeDevice)
	require.Error(t, err)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "option NUMANode")
	assert.Contains(t, err.Error(), "4294967296")
}

// TestLayoutOptionsChecked: options that depend on the granularity are
// checked once it is known, with the option and values named.
func TestLayoutOptionsChecked(t *testing.T) {
	const g = testGran
	for _, tc := range []struct {
		opts   Options
		option string
	}{
		{Options{Reserve: math.MaxUint64 - 5}, "Reserve"},
		{Options{AddrHint: 0x1000}, "AddrHint"},
		{Options{AddrHint: 4 * g, AddrAlign: 8 * g}, "AddrHint"},
		{Options{AddrHint: cuda.DevicePtr(math.MaxUint64 - g + 1)}, "AddrHint"},
		{Options{AddrHint: cuda.DevicePtr(math.MaxUint64 - 4*g + 1), Reserve: 8 * g}, "AddrHint"},
	} {
		t.Run(tc.option, func(t *testing.T) {
			tc.opts.HandleType = HandleNone
			_, err := newResource(newFake(g), fakeDevice, &tc.opts)
			require.Error(t, err)
			assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "option "+tc.option)
		})
	}
	_, err := newResource(newFake(3<<20), fakeDevice, &Options{HandleType: HandleNone})
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "a granularity that is not a power of two is refused")
	_, err = newResource(newFake(0), fakeDevice, &Options{HandleType: HandleNone})
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "a zero granularity is refused, not divided by")
}

// TestSizesNearTheTop: sizes and addresses near 2^64 are refused with the
// values named, or handled without wrapping; nothing reaches the driver
// wrapped.
func TestSizesNearTheTop(t *testing.T) {
	const g = testGran
	r, f := newFakeResource(t, g, nil)
	for _, n := range []uint64{math.MaxUint64, math.MaxUint64 - g + 2} {
		_, err := r.Allocate(n, nil)
		require.Error(t, err)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "Resource.Allocate")
		assert.Contains(t, err.Error(), strconv.FormatUint(n, 10))
	}
	b, err := r.Allocate(g, nil)
	require.NoError(t, err)
	nb, err := r.Grow(b, math.MaxUint64)
	require.Error(t, err)
	assert.Nil(t, nb)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "Resource.Grow")
	assert.False(t, b.IsClosed(), "a refused grow leaves b alone")
	nb, err = r.Shrink(b, 0)
	require.Error(t, err)
	assert.Nil(t, nb)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	checkInvariants(t, r, f)
	closeAll(t, r, f, b)

	// An allocation at the top of the address space: growing it cannot be
	// adjacent (the range would wrap), so it moves.
	top := cuda.DevicePtr(math.MaxUint64 - 2*g + 1)
	r, f = newFakeResource(t, g, &Options{HandleType: HandleNone, AddrHint: top})
	_, err = r.Allocate(3*g, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "hint plus size wraps")
	b, err = r.Allocate(g, nil)
	require.NoError(t, err)
	require.Equal(t, top, b.Ptr())
	nb, err = r.Grow(b, 3*g)
	require.NoError(t, err)
	assert.NotEqual(t, top, nb.Ptr())
	checkInvariants(t, r, f)
	closeAll(t, r, f, nb)
}

// TestPeerListsChecked: nil, own-device and duplicate peers are refused by
// SetPeerAccess with the index named, before any driver call.
func TestPeerListsChecked(t *testing.T) {
	r, f := newFakeResource(t, testGran, nil)
	b, err := r.Allocate(1, nil)
	require.NoError(t, err)
	for _, peers := range [][]*cuda.Device{{nil}, {fakeDevice}, {fakePeer1, fakePeer1}, {fakePeer2, fakePeer1, fakePeer2}} {
		calls := f.calls
		err := r.SetPeerAccess(b, ReadWrite, peers...)
		require.Error(t, err)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "Resource.SetPeerAccess: ")
		assert.Contains(t, err.Error(), "peer ")
		assert.Equal(t, calls, f.calls, "refused before the driver")
	}
	assert.ErrorIs(t, r.SetPeerAccess(b, Access(42), fakePeer1), cuda.ErrInvalidArgument)
	require.NoError(t, r.SetPeerAccess(b, ReadOnly, fakePeer1, fakePeer2))
	acc, err := r.Access(b, fakePeer2)
	require.NoError(t, err)
	assert.Equal(t, ReadOnly, acc)
	require.NoError(t, r.SetPeerAccess(b, NoAccess, fakePeer2))
	acc, err = r.Access(b, fakePeer2)
	require.NoError(t, err)
	assert.Equal(t, NoAccess, acc)
	checkInvariants(t, r, f)
	closeAll(t, r, f, b)
}
