package cuda

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fake driver applies the driver's legacy-stream rule to synchronous
// copies too: a cuMemcpyHtoD or cuMemcpyDtoH (which run on the legacy
// default stream) while a blocking stream of the device captures joins
// that capture and invalidates it, as on a real driver. That is what
// Device.MemcpyHtoD and MemcpyDtoH refuse before the driver sees them.
func TestFakeSyncCopiesInvalidateBlockingCapture(t *testing.T) {
	fk := newCtxFake(t, "13000")
	d := fk.devs[0]
	ctx, err := d.context()
	require.NoError(t, err)
	p, err := d.MemAlloc(64)
	require.NoError(t, err)
	defer d.MemFree(p)
	buf := make([]byte, 64)
	b, err := d.NewStreamWith(0, 0) // blocking
	require.NoError(t, err)
	defer b.Close()

	for _, c := range []struct {
		name string
		raw  func() uintptr
		ours func() error
	}{
		{"cuMemcpyHtoD",
			func() uintptr {
				return d.drv.MemcpyHtoD.CallCtx(ctx, uintptr(p), uintptr(unsafe.Pointer(&buf[0])), 64)
			},
			func() error { return d.MemcpyHtoD(p, unsafe.Pointer(&buf[0]), 64) }},
		{"cuMemcpyDtoH",
			func() uintptr {
				return d.drv.MemcpyDtoH.CallCtx(ctx, uintptr(unsafe.Pointer(&buf[0])), uintptr(p), 64)
			},
			func() error { return d.MemcpyDtoH(unsafe.Pointer(&buf[0]), p, 64) }},
	} {
		require.NoError(t, b.BeginCapture())
		require.ErrorIs(t, c.ours(), ErrCapturing, c.name)
		g, err := b.EndCapture()
		require.NoError(t, err, "%s: refused, the capture stayed valid", c.name)
		require.NoError(t, g.Close())

		require.NoError(t, b.BeginCapture())
		assert.Equal(t, ErrorStreamCaptureImplicit, Result(int32(c.raw())), "%s: the fake's answer", c.name)
		st, err := b.CaptureStatus()
		require.NoError(t, err)
		assert.Equal(t, CaptureStatusInvalidated, st, "%s joined and invalidated the capture", c.name)
		_, err = b.EndCapture()
		require.ErrorIs(t, err, ErrorStreamCaptureInvalidated)
		require.NoError(t, c.ours(), "%s: no capture, it runs", c.name)
	}
}
