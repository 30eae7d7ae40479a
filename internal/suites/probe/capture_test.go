//go:build linux

package probe

import (
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/stretchr/testify/require"
)

// A capture forks into another stream by a wait on its work, and joins it
// back: the forked stream is refused what a capturing stream is refused,
// cannot end or leave the capture itself, and stops capturing with it.
func TestCaptureForkJoin(t *testing.T) {
	d := dev(t, 0)
	s, w := newStream(t, d), newStream(t, d)
	check := baseline(t)
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 1 << 20})
	require.NoError(t, err)

	require.NoError(t, s.BeginCapture())
	require.NoError(t, w.WaitStream(s), "an explicit wait forks the capture")
	require.True(t, w.IsCapturing(), "w joined the capture")
	_, err = pool.Allocate(1<<10, w)
	require.ErrorIs(t, err, cuda.ErrCapturing, "a joined stream is refused like the one that began")
	_, err = w.EndCapture()
	require.ErrorIs(t, err, cuda.ErrInvalidArgument, "only the stream that began the capture ends it")
	require.Contains(t, err.Error(), "joined the capture")
	require.ErrorIs(t, w.Close(), cuda.ErrCapturing, "a joined stream cannot be destroyed mid-capture")
	require.NoError(t, w.MemsetD8Async(0, 0, 0) /* a node; 0 bytes */, "work on a joined stream is captured")
	require.NoError(t, s.WaitStream(w), "join back")
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Close())
	require.False(t, w.IsCapturing(), "the joined stream left with the capture")
	b, err := pool.Allocate(1<<10, w)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, pool.Close())
	check()
}

// A capture whose forked stream is not joined back fails at EndCapture
// as on a driver; cudamem's flags follow, and nothing stays refused.
func TestCaptureForkUnjoined(t *testing.T) {
	d := dev(t, 0)
	s, w := newStream(t, d), newStream(t, d)
	require.NoError(t, s.BeginCapture())
	require.NoError(t, w.WaitStream(s))
	_, err := s.EndCapture()
	require.Error(t, err)
	require.False(t, s.IsCapturing())
	require.False(t, w.IsCapturing(), "the forked stream left the failed capture")
	require.NoError(t, w.Sync())
}

// Closing an idle owned pool while another stream of its device captures
// puts the destruction off until the capture ends; the capture stays
// valid, and the destruction has run when the call that ends the capture
// (EndCapture, or Close of the capturing stream) returns: the driver's
// counts are back then, with nothing to wait for. The same for the pool
// closed with a buffer live, whose last free comes during the capture,
// and for a PinnedPool.
func TestCapturePoolCloseDeferred(t *testing.T) {
	d := dev(t, 0)
	type pool interface{ Close() error }
	kinds := map[string]func(t *testing.T) (pool, func()){
		"DevicePool/idle": func(t *testing.T) (pool, func()) {
			p, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 1 << 20})
			require.NoError(t, err)
			return p, func() { require.NoError(t, p.Close(), "Close returns at once") }
		},
		"PinnedPool/idle": func(t *testing.T) (pool, func()) {
			p, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{MaxSize: 1 << 20})
			require.NoError(t, err)
			return p, func() { require.NoError(t, p.Close(), "Close returns at once") }
		},
		"DevicePool/last buffer": func(t *testing.T) (pool, func()) {
			p, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 1 << 20})
			require.NoError(t, err)
			b, err := p.Allocate(1<<10, nil)
			require.NoError(t, err)
			require.NoError(t, p.Close(), "closed with a buffer live: the last free destroys it")
			return p, func() { require.NoError(t, b.Close(), "the free succeeds; the destruction waits") }
		},
	}
	ends := map[string]func(t *testing.T, s *cuda.Stream){
		"EndCapture": func(t *testing.T, s *cuda.Stream) {
			g, err := s.EndCapture()
			require.NoError(t, err, "the capture stays valid")
			require.NoError(t, g.Close())
		},
		"Stream.Close": func(t *testing.T, s *cuda.Stream) {
			require.NoError(t, s.Close(), "Close ends the capture and discards its graph")
		},
	}
	for kind, mk := range kinds {
		for end, finish := range ends {
			t.Run(kind+"/"+end, func(t *testing.T) {
				check := baseline(t)
				pools := fake.Snapshot()[fakecuda.Pools]
				s, err := d.NewStream()
				require.NoError(t, err)
				defer s.Close()
				p, closeIt := mk(t)
				for range 20 { // the destruction must be done each time, not just soon
					require.NoError(t, s.BeginCapture())
					pools := fake.Snapshot()[fakecuda.Pools]
					closeIt()
					require.Equal(t, pools, fake.Snapshot()[fakecuda.Pools], "destruction deferred while the capture runs")
					finish(t, s)
					require.Equal(t, pools-1, fake.Snapshot()[fakecuda.Pools], "destroyed when the capture's end returned")
					require.NoError(t, p.Close(), "idempotent; no deferred error")
					if end == "Stream.Close" {
						s, err = d.NewStream()
						require.NoError(t, err)
					}
					p, closeIt = mk(t)
				}
				closeIt() // no capture: at once
				require.NoError(t, p.Close())
				require.Equal(t, pools, fake.Snapshot()[fakecuda.Pools])
				require.NoError(t, s.Close())
				check()
			})
		}
	}
}

// An event of one context recorded on a stream of another is refused by
// cudamem naming both, not left to the driver's invalid-handle error.
func TestEventRecordAcrossContexts(t *testing.T) {
	d := dev(t, 0)
	c, err := d.NewContext(0)
	require.NoError(t, err)
	defer c.Close()
	e, err := c.Device().NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer e.Close()
	s := newStream(t, d)
	err = e.Record(s)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.Contains(t, err.Error(), "Event.Record")
	require.Contains(t, err.Error(), "same context")
	require.NoError(t, e.Record(c.Device().DefaultStream()), "its own context's stream")
}

// RefuseOrder with a nil or zero stream on either side never panics: the
// operation's own checks report those streams.
func TestRefuseOrderNilStreams(t *testing.T) {
	d := dev(t, 0)
	s := newStream(t, d)
	require.NoError(t, s.BeginCapture())
	defer func() {
		g, err := s.EndCapture()
		require.NoError(t, err)
		require.NoError(t, g.Close())
	}()
	for _, c := range [][2]*cuda.Stream{{nil, s}, {s, nil}, {new(cuda.Stream), s}, {s, new(cuda.Stream)}, {nil, nil}} {
		noPanic(t, "RefuseOrder", func() { _ = cuda.RefuseOrder("test", c[0], c[1]) })
	}
	var nd *cuda.Device
	noPanic(t, "nil Device", func() {
		_ = nd.RefuseDeviceWait("test")
		_ = nd.DeferWhileCapturing(func() {})
	})
}
