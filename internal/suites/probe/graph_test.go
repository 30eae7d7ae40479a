//go:build linux

package probe

import (
	"errors"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stream capture, graphs and graph memory on the fake driver: lifetimes
// (every graph, exec and graph allocation counted back to zero) and error
// paths. The fake records capture nodes but runs no data through launches;
// the GPU twins (resource/graph_gpu_test.go, cuda/graph_gpu_test.go) check
// the data.

func newStream(t *testing.T, d *cuda.Device) *cuda.Stream {
	t.Helper()
	s, err := d.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestCaptureLifecycle(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	assert.False(t, s.IsCapturing())
	st, err := s.CaptureStatus()
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusNone, st)

	require.NoError(t, s.BeginCapture())
	assert.True(t, s.IsCapturing())
	st, id, err := s.CaptureID()
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusActive, st)
	assert.NotZero(t, id)
	assert.Equal(t, int64(1), fake.Stat(fakecuda.Graphs), "the capture's graph exists")

	err = s.BeginCapture()
	assert.ErrorIs(t, err, cuda.ErrCapturing, "a second BeginCapture")

	g, err := s.EndCapture()
	require.NoError(t, err)
	assert.False(t, s.IsCapturing())
	assert.NotZero(t, g.Handle())
	assert.Equal(t, d, g.Device())

	e, err := g.Instantiate(0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), fake.Stat(fakecuda.GraphExecs))
	for range 3 {
		require.NoError(t, e.Launch(s))
	}
	require.NoError(t, e.Launch(d.DefaultStream()))
	require.NoError(t, g.Close())
	require.NoError(t, g.Close(), "idempotent")
	assert.Zero(t, g.Handle())
	require.NoError(t, e.Launch(s), "an exec outlives its graph")
	require.NoError(t, e.Close())
	require.NoError(t, e.Close())
	assert.Zero(t, e.Handle())
	assert.ErrorIs(t, e.Launch(s), cuda.ErrClosed)
	_, err = g.Instantiate(0)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.Zero(t, cuda.GraphLeaks())
}

func TestCaptureErrors(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()

	_, err := s.EndCapture()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "EndCapture without BeginCapture")
	wantErr(t, "EndCapture", err, "Stream.EndCapture")

	err = d.DefaultStream().BeginCapture()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "the legacy stream cannot capture")
	assert.ErrorIs(t, s.BeginCaptureMode(7), cuda.ErrInvalidArgument)
	assert.False(t, s.IsCapturing())

	var nilStream *cuda.Stream
	assert.ErrorIs(t, nilStream.BeginCapture(), cuda.ErrInvalidArgument)
	_, err = nilStream.EndCapture()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = nilStream.CaptureStatus()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.False(t, nilStream.IsCapturing())
	assert.NoError(t, nilStream.RefuseCapture("x"))
	assert.ErrorIs(t, (&cuda.Stream{}).BeginCapture(), cuda.ErrInvalidArgument)

	closed, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	assert.ErrorIs(t, closed.BeginCapture(), cuda.ErrClosed)
	_, err = closed.EndCapture()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.False(t, closed.IsCapturing())
}

func TestGraphNilAndZero(t *testing.T) {
	var g *cuda.Graph
	var e *cuda.GraphExec
	noPanic(t, "nil graph", func() {
		_, err := g.Instantiate(0)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.NoError(t, g.Close())
		assert.Zero(t, g.Handle())
		assert.Nil(t, g.Device())
		_, err = (&cuda.Graph{}).Instantiate(0)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.NoError(t, (&cuda.Graph{}).Close())
	})
	noPanic(t, "nil exec", func() {
		assert.ErrorIs(t, e.Launch(nil), cuda.ErrInvalidArgument)
		assert.NoError(t, e.Close())
		assert.Zero(t, e.Handle())
		assert.ErrorIs(t, (&cuda.GraphExec{}).Launch(nil), cuda.ErrInvalidArgument)
		assert.NoError(t, (&cuda.GraphExec{}).Close())
	})
	var d *cuda.Device
	noPanic(t, "nil device", func() {
		assert.ErrorIs(t, d.GraphMemTrim(), cuda.ErrInvalidArgument)
		_, err := d.GraphMemAttributes()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.ErrorIs(t, d.ResetGraphMemHighWatermarks(), cuda.ErrInvalidArgument)
	})
}

func TestGraphInstantiateAndLaunchErrors(t *testing.T) {
	d0, d1 := dev(t, 0), dev(t, 1)
	s := newStream(t, d0)
	s1 := newStream(t, d1)
	defer baseline(t)()
	require.NoError(t, s.BeginCapture())
	g, err := s.EndCapture()
	require.NoError(t, err)
	defer g.Close()
	for _, f := range []cuda.GraphInstantiateFlags{1 << 7, cuda.GraphUpload, cuda.GraphDeviceLaunch | cuda.GraphAutoFreeOnLaunch} {
		_, err := g.Instantiate(f)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "flags %#x", uint64(f))
	}
	e, err := g.Instantiate(cuda.GraphUseNodePriority)
	require.NoError(t, err)
	defer e.Close()
	assert.Equal(t, cuda.GraphUseNodePriority, e.Flags())
	err = e.Launch(s1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a stream of another device")
	assert.Contains(t, err.Error(), "GraphExec.Launch")
	assert.ErrorIs(t, e.Launch(nil), cuda.ErrInvalidArgument)
	closed, err := d0.NewStream()
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	assert.ErrorIs(t, e.Launch(closed), cuda.ErrClosed)
}

// A global-mode capture is invalidated by an unrelated cuMemAlloc (the
// reason the default is relaxed); EndCapture says so, frees the partial
// graph, and the stream can capture again.
func TestCaptureInvalidatedByGlobalMode(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	require.NoError(t, s.BeginCaptureMode(cuda.CaptureModeGlobal))
	_, err := d.MemAlloc(64)
	require.Error(t, err, "the fake plays the driver: cuMemAlloc during a global capture fails")
	st, err := s.CaptureStatus()
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusInvalidated, st)
	assert.True(t, s.IsCapturing(), "still to be ended")
	g, err := s.EndCapture()
	assert.Nil(t, g)
	assert.ErrorIs(t, err, cuda.ErrorStreamCaptureInvalidated)
	assert.Contains(t, err.Error(), "invalidated")
	assert.False(t, s.IsCapturing())
	assert.Zero(t, fake.Stat(fakecuda.Graphs), "the partial graph is gone")

	// Relaxed: the same allocation does not touch the capture.
	require.NoError(t, s.BeginCapture())
	p, err := d.MemAlloc(64)
	require.NoError(t, err)
	require.NoError(t, d.MemFree(p))
	g, err = s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
}

// Stream.Sync and Done on a capturing stream are refused before the
// driver sees them (which would invalidate the capture).
func TestCaptureRefusesSync(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	require.NoError(t, s.BeginCapture())
	err := s.Sync()
	assert.ErrorIs(t, err, cuda.ErrCapturing)
	assert.Contains(t, err.Error(), "Stream.Sync")
	_, err = s.Done()
	assert.ErrorIs(t, err, cuda.ErrCapturing)
	g, err := s.EndCapture()
	require.NoError(t, err, "the capture is still valid")
	require.NoError(t, g.Close())
	require.NoError(t, s.Sync())
}

// Closing a capturing stream ends the capture and discards its graph.
func TestCloseCapturingStream(t *testing.T) {
	d := dev(t, 0)
	defer baseline(t)()
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.BeginCapture())
	gm, err := resource.NewGraphMemory(d)
	require.NoError(t, err)
	b, err := gm.Allocate(1000, s)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.False(t, s.IsCapturing())
	// The allocation node went with the graph: the Buffer names nothing.
	_, _, err = b.Disown()
	require.NoError(t, err)
}

// The legacy default stream is refused while a blocking stream captures:
// it would join the capture and invalidate it.
func TestCaptureBlockingStreamGuardsLegacyStream(t *testing.T) {
	d := dev(t, 0)
	defer baseline(t)()
	s, err := d.NewStreamWith(0, 0) // blocking
	require.NoError(t, err)
	defer s.Close()
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, s.BeginCapture())
	assert.True(t, d.DefaultStream().IsCapturing())
	_, err = pool.Allocate(64, nil)
	assert.ErrorIs(t, err, cuda.ErrCapturing)
	assert.Contains(t, err.Error(), "legacy default stream")
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
	assert.False(t, d.DefaultStream().IsCapturing())
	b, err := pool.Allocate(64, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
}

// A borrowed stream (WrapStream) is checked with the driver.
func TestCaptureBorrowedStream(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	w, err := d.WrapStream(s.Handle())
	require.NoError(t, err)
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	defer pool.Close()
	assert.False(t, w.IsCapturing())
	require.NoError(t, s.BeginCapture())
	assert.True(t, w.IsCapturing(), "the driver says so")
	_, err = pool.Allocate(64, w)
	assert.ErrorIs(t, err, cuda.ErrCapturing)
	assert.Contains(t, err.Error(), "borrowed")
	gm, err := resource.NewGraphMemory(d)
	require.NoError(t, err)
	b, err := gm.Allocate(64, w)
	require.NoError(t, err, "graph memory on the borrowed capturing stream")
	require.NoError(t, b.Close())
	g, err := w.EndCapture() // the borrowed view may end it
	require.NoError(t, err)
	require.NoError(t, g.Close())
	// The owned view's flag did not see the borrowed view end the
	// capture; the driver, asked when the flag says capturing, did.
	assert.False(t, s.IsCapturing())
	require.NoError(t, s.BeginCapture(), "and it can capture again")
	g, err = s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
}

// Every ordinary resource refuses a capturing stream in Allocate and
// Deallocate with an error matching cuda.ErrCapturing that names the
// operation; a refused Close leaves the buffer open; the capture stays
// valid (EndCapture succeeds).
func TestOrdinaryResourcesRefuseCapture(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	defer pool.Close()
	pinned, err := resource.NewPinnedPool(nil)
	require.NoError(t, err)
	defer pinned.Close()
	managed, err := resource.NewManaged(d, nil)
	require.NoError(t, err)
	sync, err := resource.NewSyncDevice(d)
	require.NoError(t, err)
	legacy, err := resource.NewLegacyPinned()
	require.NoError(t, err)
	sub, err := resource.NewSubAllocator(pool, &resource.SubAllocatorOptions{GrowSize: 1 << 20})
	require.NoError(t, err)
	defer sub.Close()
	vm, err := virtual.New(d, nil)
	require.NoError(t, err)
	stats := resource.NewStatistics(pool)
	limit := resource.NewLimiting(pool, 1<<20)

	for _, c := range []struct {
		name string
		mr   buffer.MemoryResource
		op   string
	}{
		{"DevicePool", pool, "DevicePool"},
		{"PinnedPool", pinned, "PinnedPool"},
		{"Managed", managed, "Managed"},
		{"SyncDevice", sync, "SyncDevice"},
		{"LegacyPinned", legacy, "LegacyPinned"},
		{"SubAllocator", sub, "SubAllocator"},
		{"virtual", vm, "Resource"},
		{"Statistics(DevicePool)", stats, "DevicePool"},
		{"Limiting(DevicePool)", limit, "DevicePool"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := buffer.Allocate(c.mr, 4096, s)
			require.NoError(t, err)
			require.NoError(t, s.BeginCapture())
			_, err = buffer.Allocate(c.mr, 4096, s)
			assert.ErrorIs(t, err, cuda.ErrCapturing)
			if err != nil {
				assert.Contains(t, err.Error(), c.op+".Allocate")
			}
			err = b.Close() // on its allocation stream: capturing
			assert.ErrorIs(t, err, cuda.ErrCapturing)
			if err != nil {
				assert.Contains(t, err.Error(), c.op+".Deallocate")
			}
			assert.False(t, b.IsClosed(), "a refused Close leaves the buffer open")
			g, err := s.EndCapture()
			require.NoError(t, err, "the capture is still valid")
			require.NoError(t, g.Close())
			require.NoError(t, b.Close())
		})
	}
	assert.Zero(t, limit.Used())
	assert.Zero(t, stats.Stats().CurrentBytes)
}

// Host copies (which wait for the host, or stage) are refused on a
// capturing stream; buffer-to-buffer copies and fills are captured.
func TestCaptureBufferCopies(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	defer pool.Close()
	pinned, err := resource.NewPinnedPool(nil)
	require.NoError(t, err)
	defer pinned.Close()
	a, err := pool.Allocate(256, s)
	require.NoError(t, err)
	b, err := pool.Allocate(256, s)
	require.NoError(t, err)
	h, err := pinned.Allocate(256, s)
	require.NoError(t, err)
	host := make([]byte, 256)

	require.NoError(t, s.BeginCapture())
	for name, err := range map[string]error{
		"CopyFromHost":   buffer.CopyFromHost(a, host, s),
		"CopyToHost":     buffer.CopyToHost(host, a, s),
		"Buffer.WriteAt": func() error { _, err := a.WriteAt(host[:8], 0); return err }(),
		"Buffer.ReadAt":  func() error { _, err := a.ReadAt(host[:8], 0); return err }(),
	} {
		assert.ErrorIs(t, err, cuda.ErrCapturing, name)
		if err != nil {
			assert.Contains(t, err.Error(), name)
		}
	}
	assert.NoError(t, a.Fill32(7, s))
	assert.NoError(t, b.CopyFrom(a, s))
	assert.NoError(t, h.CopyFrom(a, s), "device to pinned host")
	assert.NoError(t, a.CopyFrom(h, s), "pinned host to device")
	g, err := s.EndCapture()
	require.NoError(t, err, "still valid")
	require.NoError(t, g.Close())
	closeAll(t, a, b, h)
}

// Graph memory: allocate → fill → copy out → free inside the capture,
// launched many times: no graph memory stays used, the reserve stays
// bounded, Trim gives it back, and everything is counted back to zero.
func TestGraphMemoryAllocFreeInGraph(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	gm, err := resource.NewGraphMemory(d)
	require.NoError(t, err)
	gm2, err := resource.NewGraphMemory(d)
	require.NoError(t, err)
	assert.Same(t, gm, gm2, "interned per device")
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	defer pool.Close()
	out, err := pool.Allocate(4096, s)
	require.NoError(t, err)
	defer out.Close()

	require.NoError(t, s.BeginCapture())
	tmp, err := gm.Allocate(4096, s)
	require.NoError(t, err)
	assert.Equal(t, s, tmp.Stream())
	require.NoError(t, tmp.Fill32(3, s))
	require.NoError(t, out.CopyFrom(tmp, s))
	require.NoError(t, tmp.Close(), "a free node")
	g, err := s.EndCapture()
	require.NoError(t, err)
	e, err := g.Instantiate(0)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	for i := range 150 {
		require.NoError(t, e.Launch(s), "launch %d", i)
		a, err := gm.Attributes()
		require.NoError(t, err)
		require.Zero(t, a.UsedCurrent, "freed in the graph")
		require.LessOrEqual(t, a.ReservedCurrent, uint64(4096), "bounded reserve")
	}
	a, err := gm.Attributes()
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), a.UsedHigh)
	assert.Equal(t, uint64(4096), a.ReservedHigh)
	require.NoError(t, gm.Trim())
	a, err = gm.Attributes()
	require.NoError(t, err)
	assert.Zero(t, a.ReservedCurrent)
	require.NoError(t, gm.ResetHighWatermarks())
	a, err = gm.Attributes()
	require.NoError(t, err)
	assert.Zero(t, a.UsedHigh)
	assert.Zero(t, a.ReservedHigh)
	require.NoError(t, e.Close())
}

// The output pattern (cuda.core's test_graph_alloc_with_output): memory
// allocated in the graph and not freed there. Without auto-free the
// second launch fails; with it each launch frees the previous launch's;
// Close outside a capture frees what the last launch left.
func TestGraphMemoryOutputBuffer(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	gm, err := resource.NewGraphMemory(d)
	require.NoError(t, err)
	capture := func() (*cuda.Graph, *buffer.Buffer) {
		require.NoError(t, s.BeginCapture())
		out, err := gm.Allocate(512, s)
		require.NoError(t, err)
		require.NoError(t, out.Fill8(1, s))
		g, err := s.EndCapture()
		require.NoError(t, err)
		return g, out
	}

	g, out := capture()
	p := out.Ptr()
	err = out.Close()
	require.Error(t, err, "not allocated before a launch")
	assert.False(t, out.IsClosed())
	e, err := g.Instantiate(0)
	require.NoError(t, err)
	_, err = g.Instantiate(0)
	assert.Error(t, err, "one instantiation at a time for a graph with memory nodes")
	require.NoError(t, e.Launch(s))
	assert.Equal(t, int64(512), fake.Stat(fakecuda.GraphUsed))
	assert.Error(t, e.Launch(s), "the last launch's memory is still allocated")
	require.NoError(t, out.Close(), "frees the launch's memory")
	assert.True(t, out.IsClosed())
	assert.Zero(t, fake.Stat(fakecuda.GraphUsed))
	require.NoError(t, e.Launch(s), "launchable again")
	require.NoError(t, e.Close(), "the launch's memory stays allocated")
	assert.Equal(t, int64(512), fake.Stat(fakecuda.GraphUsed))
	e, err = g.Instantiate(cuda.GraphAutoFreeOnLaunch)
	require.NoError(t, err, "the exec is gone, so the graph can be instantiated again")
	require.NoError(t, g.Close())
	for range 5 {
		require.NoError(t, e.Launch(s), "auto-free on launch")
		assert.Equal(t, int64(512), fake.Stat(fakecuda.GraphUsed))
	}
	require.NoError(t, e.Close())
	// What the last launch left, freed as a Disowned buffer's would be.
	require.NoError(t, s.MemFreeAsync(p))
	assert.Zero(t, fake.Stat(fakecuda.GraphUsed))
	require.NoError(t, gm.Trim())
}

func TestGraphMemoryRefusesNonCapturing(t *testing.T) {
	d0, d1 := dev(t, 0), dev(t, 1)
	s := newStream(t, d0)
	s1 := newStream(t, d1)
	defer baseline(t)()
	gm, err := resource.NewGraphMemory(d0)
	require.NoError(t, err)
	for name, st := range map[string]*cuda.Stream{"non-capturing": s, "nil": nil, "default": d0.DefaultStream()} {
		_, err := gm.Allocate(1, st)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		if err != nil {
			assert.Contains(t, err.Error(), "GraphMemory cannot perform memory operations on a non-capturing stream", name)
			assert.Contains(t, err.Error(), "GraphMemory.Allocate")
		}
	}
	_, err = gm.Allocate(1, s1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "another device's stream")
	_, err = gm.Allocate(1, &cuda.Stream{})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "zero stream")
	assert.ErrorIs(t, gm.Deallocate(0x1000, 1, s1), cuda.ErrInvalidArgument)
	assert.NoError(t, gm.Deallocate(0, 1, s))

	require.NoError(t, s.BeginCapture())
	b, err := gm.Allocate(0, s)
	require.NoError(t, err, "size 0 on a capturing stream")
	require.NoError(t, b.Close())
	_, err = gm.Allocate(1<<63+1, s)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())

	var nilGM *resource.GraphMemory
	noPanic(t, "nil GraphMemory", func() {
		_, err := nilGM.Allocate(1, s)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.ErrorIs(t, nilGM.Deallocate(1, 1, s), cuda.ErrInvalidArgument)
		assert.ErrorIs(t, nilGM.Trim(), cuda.ErrInvalidArgument)
		_, err = nilGM.Attributes()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.ErrorIs(t, nilGM.ResetHighWatermarks(), cuda.ErrInvalidArgument)
		assert.Equal(t, -1, nilGM.DeviceID())
		assert.Equal(t, -1, (&resource.GraphMemory{}).DeviceID())
		_, err = (&resource.GraphMemory{}).Allocate(1, s)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	})
	_, err = resource.NewGraphMemory(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = resource.NewGraphMemory(&cuda.Device{})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// The graph memory counters read, and the high watermarks reset (the only
// write the driver allows: cuda.core's test_graph_mem_set_attributes),
// on a device and through a nil one.
func TestGraphMemResetHighWatermarks(t *testing.T) {
	d := dev(t, 0)
	_, err := d.GraphMemAttributes()
	assert.NoError(t, err)
	assert.NoError(t, d.ResetGraphMemHighWatermarks())
	var nd *cuda.Device
	_, err = nd.GraphMemAttributes()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorIs(t, nd.ResetGraphMemHighWatermarks(), cuda.ErrInvalidArgument)
}

// Adaptors forward to GraphMemory: a Statistics over it counts graph
// allocations captured and freed in the capture.
func TestGraphMemoryUnderAdaptor(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	defer baseline(t)()
	gm, err := resource.NewGraphMemory(d)
	require.NoError(t, err)
	st := resource.NewStatistics(gm)
	require.NoError(t, s.BeginCapture())
	b, err := st.Allocate(100, s)
	require.NoError(t, err)
	assert.Equal(t, uint64(100), st.Stats().CurrentBytes)
	require.NoError(t, b.Close())
	assert.Zero(t, st.Stats().CurrentBytes)
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
}

// Captures in relaxed mode on many goroutines, while others allocate
// from an ordinary pool on their own streams: goroutines migrate between
// OS threads, and nothing interferes.
func TestCaptureConcurrentGoroutines(t *testing.T) {
	d := dev(t, 0)
	defer baseline(t)()
	gm, err := resource.NewGraphMemory(d)
	require.NoError(t, err)
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	defer pool.Close()
	const workers, rounds = 8, 20
	errs := make(chan error, 2*workers)
	for w := range 2 * workers {
		go func() {
			errs <- func() error {
				s, err := d.NewStream()
				if err != nil {
					return err
				}
				defer s.Close()
				for range rounds {
					if w >= workers { // ordinary allocations beside the captures
						b, err := pool.Allocate(1024, s)
						if err != nil {
							return err
						}
						if err := b.Close(); err != nil {
							return err
						}
						continue
					}
					if err := s.BeginCapture(); err != nil {
						return err
					}
					tmp, err := gm.Allocate(1024, s)
					if err != nil {
						return err
					}
					if err := tmp.Fill8(1, s); err != nil {
						return err
					}
					if err := tmp.Close(); err != nil {
						return err
					}
					g, err := s.EndCapture()
					if err != nil {
						return err
					}
					e, err := g.Instantiate(cuda.GraphAutoFreeOnLaunch)
					if err != nil {
						return err
					}
					if err := e.Launch(s); err != nil {
						return err
					}
					if err := errors.Join(e.Close(), g.Close()); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range 2 * workers {
		require.NoError(t, <-errs)
	}
	require.NoError(t, gm.Trim())
}
