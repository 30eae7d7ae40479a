//go:build linux && (amd64 || arm64)

package probe

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/dlpacktest"
	"github.com/cudamem/cudamem/resource"
)

// Found in review: a device tensor that starts in one allocation and ends
// in another is refused when memory between them is not allocated (only
// the two ends were checked); over adjacent allocations it is accepted.
func TestDLPackImportRefusesSpanningAGap(t *testing.T) {
	l := dlpackLib(t)
	defer baseline(t)()
	d := dev(t, 0)
	sd, err := resource.NewSyncDevice(d)
	require.NoError(t, err)
	var bs []*buffer.Buffer
	for range 3 {
		b, err := sd.Allocate(4096, nil)
		require.NoError(t, err)
		bs = append(bs, b)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].Ptr() < bs[j].Ptr() })
	defer bs[0].Close()
	defer bs[2].Close()
	spec := func(n int64) dlpacktest.Spec {
		return dlpacktest.Spec{DevType: 2, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{n}}
	}
	whole := int64(bs[2].Ptr()-bs[0].Ptr()) + 4096
	if bs[1].Ptr() == bs[0].Ptr()+4096 && bs[2].Ptr() == bs[1].Ptr()+4096 {
		// Adjacent: the three together are memory without a gap.
		p := l.Make(true, uintptr(bs[0].Ptr()), spec(whole))
		in, err := dlpack.Import(p)
		require.NoError(t, err, "adjacent allocations")
		require.NoError(t, in.Close())
	}
	require.NoError(t, bs[1].Close()) // now a gap in the middle
	p := l.Make(true, uintptr(bs[0].Ptr()), spec(whole))
	_, err = dlpack.Import(p)
	wantErr(t, "a tensor across a gap", err, "dlpack.Import")
	require.NoError(t, dlpack.Delete(p))
}

// Found in review: a tensor labelled kDLCUDAHost or kDLCUDAManaged over
// device-only memory made a host-accessible Buffer, whose first host read
// (Bytes, ReadAt) crashes on a real GPU. The driver's memory type decides
// now: device-only memory under those labels is refused, pinned and
// managed memory under either label is accepted.
func TestDLPackImportRefusesDeviceMemoryLabelledHost(t *testing.T) {
	l := dlpackLib(t)
	defer baseline(t)()
	d := dev(t, 0)
	spec := func(devType int32) dlpacktest.Spec {
		return dlpacktest.Spec{DevType: devType, Major: 1, Code: 1, Bits: 8, Lanes: 1, Shape: []int64{64}}
	}
	pool, err := resource.CurrentDevicePool(d)
	require.NoError(t, err)
	b, err := pool.Allocate(4096, nil)
	require.NoError(t, err)
	defer b.Close()
	for _, typ := range []int32{int32(dlpack.CUDAHost), int32(dlpack.CUDAManaged)} {
		p := l.Make(true, uintptr(b.Ptr()), spec(typ))
		before := l.Deleted()
		_, err := dlpack.Import(p)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "device memory as %v", dlpack.DeviceType(typ))
		assert.ErrorContains(t, err, "not reachable from the host")
		assert.Equal(t, before, l.Deleted(), "refused: the deleter is not called")
		require.NoError(t, dlpack.Delete(p))
	}
	in, err := dlpack.Import(l.Make(true, uintptr(b.Ptr()), spec(int32(dlpack.CUDA))))
	require.NoError(t, err, "the same memory as kDLCUDA")
	require.NoError(t, in.Close())

	pinned, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	managed, err := resource.NewManaged(d, nil)
	require.NoError(t, err)
	for _, mr := range []buffer.MemoryResource{pinned, managed} {
		hb, err := buffer.Allocate(mr, 64, nil)
		require.NoError(t, err)
		for _, typ := range []int32{int32(dlpack.CUDAHost), int32(dlpack.CUDAManaged)} {
			in, err := dlpack.Import(l.Make(true, uintptr(hb.Ptr()), spec(typ)))
			require.NoError(t, err, "%T memory as %v", mr, dlpack.DeviceType(typ))
			assert.True(t, in.HostAccessible())
			require.NoError(t, in.Close())
		}
		require.NoError(t, hb.Close())
	}
}
