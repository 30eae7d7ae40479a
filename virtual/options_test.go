package virtual

import (
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
	} {
		t.Run(tc.option, func(t *testing.T) {
			_, err := tc.opts.props(nil)
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

func TestUndoRunsInReverse(t *testing.T) {
	var got []int
	var u undo
	for i := 0; i < 3; i++ {
		u.add(func() { got = append(got, i) })
	}
	u.run()
	assert.Equal(t, []int{2, 1, 0}, got)
	u.run()
	assert.Equal(t, []int{2, 1, 0}, got, "undo steps run once")
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
