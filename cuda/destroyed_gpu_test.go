package cuda_test

// GPU tests of destroyed handles and fabric pools, for what only the real
// driver shows (it may crash where the fake counts a crash). They skip
// without a GPU and fail with CUDAMEM_REQUIRE_GPU=1:
// TestGPUWrapDestroyedContext, TestGPUWrapDestroyedGreenContext,
// TestGPUForeignAfterContextClose, TestGPUFabricPoolEveryLocation.

import (
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/loader"
)

func wantDestroyed(t *testing.T, err error, op string, h uintptr, res cuda.Result) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorIs(t, err, res)
	assert.Contains(t, err.Error(), op)
	assert.Contains(t, err.Error(), fmt.Sprintf("%#x", h))
}

// GPU: WrapContext of a context Context.Close destroyed is refused (the
// driver crashed the process on it). Where the driver gives a destroyed
// context's address to the next context, a context cudamem makes there is
// wrapped as itself.
func TestGPUWrapDestroyedContext(t *testing.T) {
	d := cudatest.Device(t)
	c, err := d.NewContext(0)
	require.NoError(t, err)
	h := c.Handle()
	require.NoError(t, c.Close())
	for range 2 {
		_, err = cuda.WrapContext(h)
		wantDestroyed(t, err, "WrapContext", h, cuda.ErrorInvalidContext)
	}
	reused := false
	for i := 0; i < 8 && !reused; i++ {
		c2, err := d.NewContext(0)
		require.NoError(t, err)
		if c2.Handle() == h {
			reused = true
			v, err := cuda.WrapContext(h)
			require.NoError(t, err, "a context cudamem made at the address is live")
			assert.Same(t, c2.Device(), v)
			_, _, err = v.MemInfo()
			require.NoError(t, err)
		}
		h2 := c2.Handle()
		require.NoError(t, c2.Close())
		_, err = cuda.WrapContext(h2)
		wantDestroyed(t, err, "WrapContext", h2, cuda.ErrorInvalidContext)
	}
	t.Logf("the driver reused the destroyed context's address: %v", reused)
}

// GPU: the same for green contexts: WrapGreenContext of a destroyed green
// context, and WrapContext of its context, are refused.
func TestGPUWrapDestroyedGreenContext(t *testing.T) {
	d := cudatest.Device(t)
	if unsafe.Sizeof(uintptr(0)) < 8 {
		t.Skip("green contexts need a 64-bit platform")
	}
	c, err := d.NewGreenContext(16)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	g, h := c.Device().GreenContext(), c.Handle()
	require.NoError(t, c.Close())
	_, err = cuda.WrapGreenContext(g)
	wantDestroyed(t, err, "WrapGreenContext", g, cuda.ErrorInvalidHandle)
	_, err = cuda.WrapContext(h)
	wantDestroyed(t, err, "WrapContext", h, cuda.ErrorInvalidContext)
	_, err = c.Device().NewStream()
	assert.ErrorIs(t, err, cuda.ErrClosed)
}

// GPU: a foreign function bound to a view whose context was closed is
// not called, and the dead context never reaches cuCtxSetCurrent.
func TestGPUForeignAfterContextClose(t *testing.T) {
	d := cudatest.Device(t)
	libc, err := loader.OpenLibrary("libc.so.6")
	if err != nil {
		t.Skipf("no libc to call: %v", err)
	}
	labs, err := libc.Lookup("labs")
	require.NoError(t, err)
	c, err := d.NewContext(0)
	require.NoError(t, err)
	f, err := c.Device().Foreign(labs)
	require.NoError(t, err)
	minus3 := -3
	r, err := f.Call(uintptr(minus3))
	require.NoError(t, err)
	assert.EqualValues(t, 3, r)
	require.NoError(t, c.Close())
	_, err = f.Call(uintptr(minus3))
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.ErrorIs(t, c.Device().Do(func() error { return nil }), cuda.ErrClosed)
}

// GPU: a pool with fabric handles at every location type. Without IMEX
// the driver made such a pool at host and host NUMA locations, refused its
// export, and crashed the process in cuMemPoolDestroy: CreateMemPool must
// refuse it up front (ErrNotSupported naming IMEX) or, where fabric
// handles work, make a pool that exports and is destroyed cleanly.
func TestGPUFabricPoolEveryLocation(t *testing.T) {
	d := cudatest.Device(t)
	f, err := d.Features()
	require.NoError(t, err)
	if !f.MemoryPools {
		t.Skip("no memory pools")
	}
	for _, loc := range []cuda.MemLocation{
		{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())},
		{Type: cuda.MemLocationTypeHost},
		{Type: cuda.MemLocationTypeHostNUMA, ID: 0},
		{Type: cuda.MemLocationTypeHostNUMACurrent},
	} {
		name := fmt.Sprintf("location type %d, id %d", loc.Type, loc.ID)
		p, err := d.CreateMemPool(&cuda.MemPoolProps{AllocType: cuda.MemAllocationTypePinned,
			HandleTypes: cuda.MemHandleTypeFabric, Location: loc})
		if err != nil {
			t.Logf("%s: %v", name, err)
			if errors.Is(err, cuda.ErrNotSupported) {
				// A location type the driver takes no fabric memory at
				// (INVALID_VALUE, seen for the host locations) is said
				// so; a refusal elsewhere names the missing IMEX service.
				want := "IMEX"
				if errors.Is(err, cuda.ErrorInvalidValue) {
					want = "takes no fabric-shareable memory"
				}
				assert.Contains(t, err.Error(), want, name)
			}
			continue
		}
		// Made: fabric handles work here, so its export must too (a pool
		// that cannot be exported is the one the driver crashes on).
		fh, xerr := p.ExportFabric()
		require.NoError(t, xerr, "%s: a pool made with fabric handles exports", name)
		assert.False(t, fh.IsZero())
		require.NoError(t, p.Destroy(), name)
	}
}
