package resource_test

// GPU tests of graph memory and of the capture refusals (they skip
// without a GPU: cudatest.Device). The Go twins of cuda.core's
// tests/test_graph_mem.py are named after them: TestGraphAlloc,
// TestGraphAllocWithOutput, TestGraphMemSetAttributes,
// TestGmrCheckCaptureState, TestDmrCheckCaptureState.

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

var captureModes = []struct {
	name string
	mode cuda.CaptureMode
}{
	{"global", cuda.CaptureModeGlobal},
	{"thread_local", cuda.CaptureModeThreadLocal},
	{"relaxed", cuda.CaptureModeRelaxed},
}

// beginCapture begins a capture in mode; the strict modes need the
// goroutine on one OS thread until EndCapture (see cuda.CaptureMode),
// which the returned function ends and unlocks.
func beginCapture(t *testing.T, s *cuda.Stream, mode cuda.CaptureMode) func() *cuda.Graph {
	t.Helper()
	if mode != cuda.CaptureModeRelaxed {
		runtime.LockOSThread()
	}
	require.NoError(t, s.BeginCaptureMode(mode))
	return func() *cuda.Graph {
		t.Helper()
		g, err := s.EndCapture()
		if mode != cuda.CaptureModeRelaxed {
			runtime.UnlockOSThread()
		}
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, g.Close()) })
		return g
	}
}

func instantiate(t *testing.T, g *cuda.Graph, flags cuda.GraphInstantiateFlags) *cuda.GraphExec {
	t.Helper()
	e, err := g.Instantiate(flags)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.Close()) })
	return e
}

func words(t *testing.T, s *cuda.Stream, b *buffer.Buffer) []uint32 {
	t.Helper()
	out := make([]uint32, b.Size()/4)
	require.NoError(t, buffer.CopyToHost(out, b, s))
	return out
}

func allEqual(t *testing.T, got []uint32, want uint32, what string) {
	t.Helper()
	for i, v := range got {
		if v != want {
			t.Fatalf("%s: word %d is %d, want %d", what, i, v, want)
		}
	}
}

// TestGraphMemoryPipelineGPU captures allocate (graph memory) → copy in →
// kernel → copy out to a pool buffer → free, launches it 120 times with
// different inputs and checks every output, and checks that the reserved
// graph memory stays bounded (it does not grow with the launches) and
// that Trim brings it down once the exec is gone.
func TestGraphMemoryPipelineGPU(t *testing.T) {
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	s := cudatest.Stream(t, dev)
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{})
	checkLeaks(t, pool, dev)
	gm, err := resource.NewGraphMemory(dev)
	require.NoError(t, err)
	require.NoError(t, dev.Sync())
	require.NoError(t, gm.Trim())
	require.NoError(t, gm.ResetHighWatermarks())

	const n = 4 * mib
	const nw = n / 4
	in, err := pool.Allocate(n, s)
	require.NoError(t, err)
	defer closeBuf(t, in)
	out, err := pool.Allocate(n, s)
	require.NoError(t, err)
	defer closeBuf(t, out)

	require.NoError(t, s.BeginCapture())
	tmp, err := gm.Allocate(n, s)
	require.NoError(t, err)
	require.NoError(t, tmp.CopyFrom(in, s))
	require.NoError(t, k.Add(s, tmp.Ptr(), nw, 5))
	require.NoError(t, out.CopyFrom(tmp, s))
	require.NoError(t, tmp.Close(), "a free node")
	g, err := s.EndCapture()
	require.NoError(t, err)
	e, err := g.Instantiate(0)
	require.NoError(t, err)
	require.NoError(t, g.Close())

	host := make([]uint32, nw)
	got := make([]uint32, nw)
	var bound uint64
	for i := range 120 {
		for j := range host {
			host[j] = uint32(i)*7919 + uint32(j)
		}
		require.NoError(t, buffer.CopyFromHost(in, host, s))
		require.NoError(t, e.Launch(s), "launch %d", i)
		require.NoError(t, buffer.CopyToHost(got, out, s))
		for j := range got {
			if got[j] != host[j]+5 {
				t.Fatalf("launch %d: word %d is %d, want %d", i, j, got[j], host[j]+5)
			}
		}
		a, err := gm.Attributes()
		require.NoError(t, err)
		switch i {
		case 0:
			require.NotZero(t, a.ReservedCurrent, "the first launch reserved graph memory")
			require.GreaterOrEqual(t, a.UsedHigh, uint64(n), "it allocated the node")
		case 1:
			bound = a.ReservedCurrent
			require.Less(t, bound, uint64(32*n), "one node's memory, rounded up, not one per launch")
		default:
			require.LessOrEqual(t, a.ReservedCurrent, bound, "launch %d: the reserve grew", i)
		}
	}
	require.NoError(t, s.Sync())
	before, err := gm.Attributes()
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.NoError(t, dev.Sync())
	require.NoError(t, gm.Trim())
	after, err := gm.Attributes()
	require.NoError(t, err)
	t.Logf("graph memory: reserved %d before trim, %d after; high %d; used high %d", before.ReservedCurrent, after.ReservedCurrent, before.ReservedHigh, before.UsedHigh)
	assert.Less(t, after.ReservedCurrent, before.ReservedCurrent, "Trim gives the reserve back")
	assert.Zero(t, cuda.GraphLeaks())
}

// TestOrdinaryResourcesRefuseCaptureGPU: every ordinary resource refuses a
// capturing stream in Allocate and Deallocate (cuda.ErrCapturing), the
// buffer stays open, host copies are refused too, and the capture is
// still valid afterwards: EndCapture succeeds and the graph (which holds
// the fill and copy that were allowed) runs.
func TestOrdinaryResourcesRefuseCaptureGPU(t *testing.T) {
	dev := cudatest.Device(t)
	s := cudatest.Stream(t, dev)
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{})
	checkLeaks(t, pool, dev)
	pinned, err := resource.NewPinnedPool(nil)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pinned.Close()) })
	managed, err := resource.NewManaged(dev, nil)
	require.NoError(t, err)
	syncDev, err := resource.NewSyncDevice(dev)
	require.NoError(t, err)
	legacy, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	sub, err := resource.NewSubAllocator(pool, &resource.SubAllocatorOptions{GrowSize: 2 * mib})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sub.Close()) })
	vm, err := virtual.New(dev, nil)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)

	for _, c := range []struct {
		name, op string
		mr       buffer.MemoryResource
	}{
		{"DevicePool", "DevicePool", pool},
		{"PinnedPool", "PinnedPool", pinned},
		{"Managed", "Managed", managed},
		{"SyncDevice", "SyncDevice", syncDev},
		{"LegacyPinned", "LegacyPinned", legacy},
		{"SubAllocator", "SubAllocator", sub},
		{"virtual", "Resource", vm},
		{"Statistics", "DevicePool", resource.NewStatistics(pool)},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := buffer.Allocate(c.mr, 64*kib, s)
			require.NoError(t, err)
			dst, err := pool.Allocate(64*kib, s)
			require.NoError(t, err)
			require.NoError(t, s.Sync())

			require.NoError(t, s.BeginCapture())
			_, err = buffer.Allocate(c.mr, 64*kib, s)
			require.ErrorIs(t, err, cuda.ErrCapturing)
			assert.Contains(t, err.Error(), c.op+".Allocate")
			err = b.Close()
			require.ErrorIs(t, err, cuda.ErrCapturing)
			assert.Contains(t, err.Error(), c.op+".Deallocate")
			assert.False(t, b.IsClosed())
			err = buffer.CopyFromHost(b, make([]byte, 64*kib), s)
			assert.ErrorIs(t, err, cuda.ErrCapturing)
			require.NoError(t, dst.Fill32(0x01020304, s), "a fill is captured")
			require.NoError(t, b.CopyFrom(dst, s), "a copy into the resource's memory is captured")
			st, err := s.CaptureStatus()
			require.NoError(t, err)
			require.Equal(t, cuda.CaptureStatusActive, st, "the refusals left the capture valid")
			g, err := s.EndCapture()
			require.NoError(t, err)
			e, err := g.Instantiate(0)
			require.NoError(t, err)
			require.NoError(t, e.Launch(s))
			got := words(t, s, b)
			allEqual(t, got, 0x01020304, "pool → "+c.name+" copy after launch")
			require.NoError(t, e.Close())
			require.NoError(t, g.Close())
			closeBuf(t, b)
			closeBuf(t, dst)
		})
	}
}

// TestGraphAlloc is cuda.core's test_graph_alloc: a graph that allocates a
// buffer, increments or fills it and copies it out, freeing it inside the
// graph, in every capture mode; the "no_graph" mode runs the same work on
// a DevicePool.
func TestGraphAlloc(t *testing.T) {
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	const nbytes = 64
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{})
	gm, err := resource.NewGraphMemory(dev)
	require.NoError(t, err)
	apply := func(t *testing.T, mr buffer.MemoryResource, s *cuda.Stream, out *buffer.Buffer, action string) {
		b, err := buffer.Allocate(mr, nbytes, s)
		require.NoError(t, err)
		switch action {
		case "incr":
			require.NoError(t, b.CopyFrom(out, s))
			for range 3 {
				require.NoError(t, k.Add(s, b.Ptr(), nbytes/4, 1))
			}
		case "fill":
			require.NoError(t, b.Fill32(3, s))
		}
		require.NoError(t, out.CopyFrom(b, s))
		require.NoError(t, b.Close())
	}
	for _, action := range []string{"incr", "fill"} {
		for _, mode := range append([]struct {
			name string
			mode cuda.CaptureMode
		}{{"no_graph", -1}}, captureModes...) {
			t.Run(action+"/"+mode.name, func(t *testing.T) {
				s := cudatest.Stream(t, dev)
				out, err := pool.Allocate(nbytes, s)
				require.NoError(t, err)
				defer closeBuf(t, out)
				require.NoError(t, out.Fill32(0, s))
				if mode.mode < 0 {
					apply(t, pool, s, out, action)
					allEqual(t, words(t, s, out), 3, "no graph")
					return
				}
				end := beginCapture(t, s, mode.mode)
				apply(t, gm, s, out, action)
				e := instantiate(t, end(), 0)
				require.NoError(t, e.Launch(s))
				allEqual(t, words(t, s, out), 3, "first launch")
				if action == "incr" {
					require.NoError(t, e.Launch(s))
					allEqual(t, words(t, s, out), 6, "second launch")
				}
			})
		}
	}
}

// TestGraphAllocWithOutput is cuda.core's test_graph_alloc_with_output:
// memory allocated in the graph and used after it, which needs
// GraphAutoFreeOnLaunch to relaunch; the Buffer's Close outside a capture
// frees what the last launch left.
func TestGraphAllocWithOutput(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("auto free on launch is not supported on Windows")
	}
	dev := cudatest.Device(t)
	k := cudatest.LoadKernels(t, dev)
	const nbytes = 64
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{})
	gm, err := resource.NewGraphMemory(dev)
	require.NoError(t, err)
	for _, mode := range captureModes {
		t.Run(mode.name, func(t *testing.T) {
			s := cudatest.Stream(t, dev)
			in, err := pool.Allocate(nbytes, s)
			require.NoError(t, err)
			defer closeBuf(t, in)
			require.NoError(t, in.Fill32(0, s))

			end := beginCapture(t, s, mode.mode)
			out, err := gm.Allocate(nbytes, s)
			require.NoError(t, err)
			require.NoError(t, out.CopyFrom(in, s))
			require.NoError(t, k.Add(s, out.Ptr(), nbytes/4, 1))
			e := instantiate(t, end(), cuda.GraphAutoFreeOnLaunch)

			require.NoError(t, e.Launch(s))
			allEqual(t, words(t, s, out), 1, "first launch")
			require.NoError(t, in.Fill32(5, s))
			require.NoError(t, e.Launch(s))
			allEqual(t, words(t, s, out), 6, "second launch")
			require.NoError(t, out.Close(), "frees the last launch's memory, outside a capture")
			require.NoError(t, s.Sync())
		})
	}
}

// TestGraphMemSetAttributes is cuda.core's test_graph_mem_set_attributes:
// the counters see an allocation; only the high watermarks are writable,
// and only to 0; they survive a free and a trim, and can be reset.
func TestGraphMemSetAttributes(t *testing.T) {
	dev := cudatest.Device(t)
	gm, err := resource.NewGraphMemory(dev)
	require.NoError(t, err)
	for _, mode := range captureModes {
		t.Run(mode.name, func(t *testing.T) {
			s := cudatest.Stream(t, dev)
			// Allocate 1 KiB in a graph and launch it: the memory
			// outlives the graph.
			end := beginCapture(t, s, mode.mode)
			b, err := gm.Allocate(1024, s)
			require.NoError(t, err)
			e := instantiate(t, end(), 0)
			require.NoError(t, e.Launch(s))
			require.NoError(t, s.Sync())
			a, err := gm.Attributes()
			require.NoError(t, err)
			assert.NotZero(t, a.ReservedCurrent)
			assert.NotZero(t, a.ReservedHigh)
			assert.NotZero(t, a.UsedCurrent)
			assert.NotZero(t, a.UsedHigh)

			require.NoError(t, b.Close(), "free outside the graph")
			require.NoError(t, s.Sync())
			a, err = gm.Attributes()
			require.NoError(t, err)
			assert.NotZero(t, a.ReservedCurrent)
			assert.NotZero(t, a.ReservedHigh)
			assert.NotZero(t, a.UsedHigh)
			require.NoError(t, gm.Trim())
			a, err = gm.Attributes()
			require.NoError(t, err)
			assert.NotZero(t, a.ReservedHigh, "high watermarks remain after free and trim")
			assert.NotZero(t, a.UsedHigh)
			// Resetting is allowed; whether the marks read 0 afterwards is
			// platform-dependent (cuda.core does not assert it either).
			require.NoError(t, gm.ResetHighWatermarks())
			require.NoError(t, gm.Trim())
		})
	}
}

// TestGmrCheckCaptureState is cuda.core's test_gmr_check_capture_state.
func TestGmrCheckCaptureState(t *testing.T) {
	dev := cudatest.Device(t)
	gm, err := resource.NewGraphMemory(dev)
	require.NoError(t, err)
	for _, mode := range captureModes {
		t.Run(mode.name, func(t *testing.T) {
			s := cudatest.Stream(t, dev)
			_, err := gm.Allocate(1, s)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "GraphMemory cannot perform memory operations on a non-capturing stream")
			end := beginCapture(t, s, mode.mode)
			b, err := gm.Allocate(1, s)
			require.NoError(t, err)
			require.NoError(t, b.Close())
			end()
		})
	}
}

// TestDmrCheckCaptureState is cuda.core's test_dmr_check_capture_state.
func TestDmrCheckCaptureState(t *testing.T) {
	dev := cudatest.Device(t)
	pool := ownedPool(t, dev, &resource.DevicePoolOptions{})
	for _, mode := range captureModes {
		t.Run(mode.name, func(t *testing.T) {
			s := cudatest.Stream(t, dev)
			b, err := pool.Allocate(1, s)
			require.NoError(t, err)
			closeBuf(t, b)
			end := beginCapture(t, s, mode.mode)
			_, err = pool.Allocate(1, s)
			require.ErrorIs(t, err, cuda.ErrCapturing)
			assert.Contains(t, err.Error(), "use GraphMemory for allocations inside a capture")
			end()
		})
	}
}
