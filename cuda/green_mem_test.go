package cuda

import (
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestGreenContextDriverMemory makes and destroys green contexts with the
// driver's calls alone, then through NewGreenContext and Close, and logs
// how free device memory moved for each: it tells memory the driver keeps
// per green context from memory cudamem would lose (the fault sweep logs
// such drops for green contexts instead of failing on them).
func TestGreenContextDriverMemory(t *testing.T) {
	ds, err := devices()
	if err != nil || len(ds) == 0 {
		if os.Getenv("CUDAMEM_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %v (%d devices)", err, len(ds))
		}
		t.Skipf("no GPU: %v", err)
	}
	d := ds[0]
	if name := d.greenMissing(); name != "" {
		t.Skipf("no green contexts: %s missing", name)
	}
	pctx, err := d.context()
	require.NoError(t, err)
	drv := d.drv
	raw := func() {
		var all, group devResource
		require.True(t, ok(drv.DeviceGetDevResource.CallCtx(pctx, uintptr(d.handle), uintptr(unsafe.Pointer(&all)), devResourceTypeSM)))
		n := uint32(1)
		require.True(t, ok(drv.DevSmResourceSplitByCount.CallCtx(pctx, uintptr(unsafe.Pointer(&group)), uintptr(unsafe.Pointer(&n)),
			uintptr(unsafe.Pointer(&all)), 0, 0, 8)))
		var desc, g uintptr
		require.True(t, ok(drv.DevResourceGenerateDesc.CallCtx(pctx, uintptr(unsafe.Pointer(&desc)), uintptr(unsafe.Pointer(&group)), 1)))
		require.True(t, ok(drv.GreenCtxCreate.CallCtx(pctx, uintptr(unsafe.Pointer(&g)), desc, uintptr(d.handle), greenCtxDefaultFlag)))
		require.True(t, ok(drv.GreenCtxDestroy.Call(g)))
	}
	ours := func() {
		c, err := d.NewGreenContext(8)
		require.NoError(t, err)
		require.NoError(t, c.Close())
	}
	const n = 8
	var deltas []int64
	for _, tc := range []struct {
		name string
		f    func()
	}{{"raw driver calls", raw}, {"NewGreenContext and Close", ours}} {
		tc.f() // first use: whatever is made once is not counted
		before, _, err := d.MemInfo()
		require.NoError(t, err)
		for range n {
			tc.f()
		}
		after, _, err := d.MemInfo()
		require.NoError(t, err)
		t.Logf("%s: %d green contexts made and destroyed, free memory %+d KiB", tc.name, n, (int64(after)-int64(before))/1024)
		deltas = append(deltas, int64(after)-int64(before))
	}
	// cudamem may lose no more than the driver's own calls do (with one
	// green context's 4 MiB of slack for the driver's lazy release).
	require.GreaterOrEqual(t, deltas[1], deltas[0]-4<<20, "free memory lost through NewGreenContext and Close beyond what the driver's own calls lose")
}
