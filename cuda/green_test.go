package cuda

import (
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// CUdevResource (CUDA 13.0, RESOURCE_ABI_VERSION 1): an enum, 92 bytes
// of padding, then a union of CUdevSmResource (three unsigned ints) and 48
// bytes: 4 + 92 + 48 = 144, 4-byte aligned, the union at 96.
func TestABIDevResource(t *testing.T) {
	var r devResource
	assert.EqualValues(t, 144, unsafe.Sizeof(r))
	assert.EqualValues(t, 4, unsafe.Alignof(r))
	assert.EqualValues(t, 0, unsafe.Offsetof(r.Type))
	assert.EqualValues(t, 96, unsafe.Offsetof(r.SM))
	assert.EqualValues(t, 12, unsafe.Sizeof(r.SM))
	assert.EqualValues(t, 4, unsafe.Offsetof(r.SM.MinSMPartitionSize))
	assert.EqualValues(t, 8, unsafe.Offsetof(r.SM.SMCoscheduledAlignment))
}

func TestGreenContextFake(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) < 8 {
		t.Skip("green contexts need a 64-bit platform")
	}
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	d := fk.devs[1]
	for _, bad := range []int{0, -1, 133, math.MaxInt32} {
		_, err := d.NewGreenContext(bad)
		assert.ErrorIs(t, err, ErrInvalidArgument, "%d SMs", bad)
		assert.Contains(t, err.Error(), "Device.NewGreenContext")
	}
	for _, bad := range []*Device{nil, {}} {
		_, err := bad.NewGreenContext(8)
		assert.ErrorIs(t, err, ErrInvalidArgument)
	}
	_, err := fakeDevice().NewGreenContext(8)
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.Zero(t, fk.contexts())

	c, err := d.NewGreenContext(15)
	require.NoError(t, err)
	assert.Equal(t, 16, c.SMCount(), "rounded up to the fake's alignment")
	assert.EqualValues(t, 1, fk.contexts())
	v := c.Device()
	g := v.GreenContext()
	require.NotZero(t, g)
	assert.Zero(t, d.GreenContext())
	assert.Contains(t, v.String(), "green context")
	assert.Same(t, d, v.Primary())
	w, err := WrapGreenContext(g)
	require.NoError(t, err)
	assert.Same(t, v, w, "one view per green context")

	// Streams come from cuGreenCtxStreamCreate: non-blocking only.
	_, err = v.NewStreamWith(0, 0)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	s, err := v.NewStream()
	require.NoError(t, err)
	ws, err := v.WrapStream(s.Handle())
	require.NoError(t, err, "a green context's own stream")
	require.NoError(t, ws.Sync())
	require.NoError(t, ws.Close())
	_, err = d.WrapStream(s.Handle())
	assert.ErrorIs(t, err, ErrInvalidArgument, "a green stream on the primary view")
	assert.Contains(t, err.Error(), "green context")
	ps, err := d.NewStream()
	require.NoError(t, err)
	_, err = v.WrapStream(ps.Handle())
	assert.ErrorIs(t, err, ErrInvalidArgument, "a primary stream on the green view")
	require.NoError(t, ps.Close())
	_, _, err = v.MemInfo()
	require.NoError(t, err)

	// Streams first, then the context (cuGreenCtxDestroy leaves streams).
	require.NoError(t, s.Close())
	assert.Zero(t, fk.streams())
	require.NoError(t, c.Close())
	assert.Zero(t, fk.contexts())
	require.NoError(t, c.Close())
	_, err = v.NewStream()
	assert.ErrorIs(t, err, ErrClosed)
	_, err = WrapGreenContext(g)
	assert.ErrorIs(t, err, ErrorInvalidHandle)

	// A stream left open is the driver's leak, and its Close says so.
	c, err = d.NewGreenContext(8)
	require.NoError(t, err)
	s, err = c.Device().NewStream()
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.ErrorIs(t, s.Close(), ErrClosed)

	_, err = WrapGreenContext(0)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = WrapGreenContext(0x4321)
	assert.ErrorIs(t, err, ErrorInvalidHandle)
	var zero *Context
	assert.Zero(t, zero.SMCount())
	assert.Zero(t, (*Device)(nil).GreenContext())
}
