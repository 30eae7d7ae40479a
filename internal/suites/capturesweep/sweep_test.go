//go:build linux

package capturesweep

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/stretchr/testify/require"
)

// The sweep's operations and situations follow; the fake driver models
// the driver's capture rules (joining by event wait, isolation,
// cuCtxSynchronize during capture, captured events, uncapturable batched
// copies), and the GPU test runs the same cases on the real one.

// capEnv is one case's world: resources and buffers made before the
// capture begins, and what the operation made that must be closed after.
type capEnv struct {
	t      *testing.T
	d      *cuda.Device
	pool   *resource.DevicePool
	pinned *resource.PinnedPool
	sub    *resource.SubAllocator
	syncd  *resource.SyncDevice
	gm     *resource.GraphMemory
	onS    *buffer.Buffer // from pool, allocated on the operation's stream
	onW    *buffer.Buffer // from pool, allocated on the other stream
	host   *buffer.Buffer // from pinned
	mgd    *buffer.Buffer // managed memory (cuMemAllocManaged)
	ev     *cuda.Event    // recorded on the other stream before the capture
	later  []func() error // run after the capture ended
}

func (e *capEnv) keep(b *buffer.Buffer, err error) error {
	if err == nil && b != nil {
		e.later = append(e.later, b.Close)
	}
	return err
}

type capOp struct {
	name string
	run  func(e *capEnv, s, w *cuda.Stream) error
}

func captureOps() []capOp {
	const kib = 1 << 10
	return []capOp{
		// cuda: streams and events.
		{"Stream.Sync", func(e *capEnv, s, w *cuda.Stream) error { return s.Sync() }},
		{"Stream.Done", func(e *capEnv, s, w *cuda.Stream) error { _, err := s.Done(); return err }},
		{"Stream.SyncContext", func(e *capEnv, s, w *cuda.Stream) error { return s.SyncContext(context.Background()) }},
		{"Stream.WaitStream", func(e *capEnv, s, w *cuda.Stream) error { return s.WaitStream(w) }},
		{"Stream.WaitEvent/recorded now", func(e *capEnv, s, w *cuda.Stream) error {
			ev, err := e.d.NewEvent(cuda.EventDisableTiming)
			if err != nil {
				return err
			}
			e.later = append(e.later, ev.Close)
			if err := ev.Record(w); err != nil {
				return err
			}
			return s.WaitEvent(ev)
		}},
		{"Stream.WaitEvent/recorded before", func(e *capEnv, s, w *cuda.Stream) error { return s.WaitEvent(e.ev) }},
		{"Event.Record+Sync", func(e *capEnv, s, w *cuda.Stream) error {
			ev, err := e.d.NewEvent(cuda.EventDefault)
			if err != nil {
				return err
			}
			e.later = append(e.later, ev.Close)
			if err := ev.Record(s); err != nil {
				return err
			}
			return ev.Sync()
		}},
		{"Event.Record+Done", func(e *capEnv, s, w *cuda.Stream) error {
			ev, err := e.d.NewEvent(cuda.EventDefault)
			if err != nil {
				return err
			}
			e.later = append(e.later, ev.Close)
			if err := ev.Record(s); err != nil {
				return err
			}
			_, err = ev.Done()
			return err
		}},
		{"Event.Record+SyncContext", func(e *capEnv, s, w *cuda.Stream) error {
			ev, err := e.d.NewEvent(cuda.EventDefault)
			if err != nil {
				return err
			}
			e.later = append(e.later, ev.Close)
			if err := ev.Record(s); err != nil {
				return err
			}
			return ev.SyncContext(context.Background())
		}},
		{"Elapsed", func(e *capEnv, s, w *cuda.Stream) error {
			a, err := e.d.NewEvent(cuda.EventDefault)
			if err != nil {
				return err
			}
			e.later = append(e.later, a.Close)
			if err := a.Record(s); err != nil {
				return err
			}
			if !s.IsCapturing() {
				// Elapsed needs both events complete; only a captured
				// event is what this case is about.
				if err := a.Sync(); err != nil {
					return err
				}
			}
			_, err = cuda.Elapsed(e.ev, a)
			return err
		}},
		{"Device.Sync", func(e *capEnv, s, w *cuda.Stream) error { return e.d.Sync() }},
		{"Device.SyncContext", func(e *capEnv, s, w *cuda.Stream) error { return e.d.SyncContext(context.Background()) }},
		{"Stream.MemsetD8Async", func(e *capEnv, s, w *cuda.Stream) error {
			return s.MemsetD8Async(e.onS.Ptr(), 1, e.onS.Size())
		}},
		{"Stream.MemcpyAsync", func(e *capEnv, s, w *cuda.Stream) error {
			return s.MemcpyAsync(e.onS.Ptr(), e.onW.Ptr(), e.onS.Size())
		}},
		{"Stream.MemcpyBatchAsync", func(e *capEnv, s, w *cuda.Stream) error {
			return s.MemcpyBatchAsync([]cuda.DevicePtr{e.onS.Ptr()}, []cuda.DevicePtr{e.onW.Ptr()}, []uint64{kib}, nil, nil)
		}},
		// buffer.
		{"Buffer.Fill8", func(e *capEnv, s, w *cuda.Stream) error { return e.onS.Fill8(7, s) }},
		{"Buffer.CopyFrom", func(e *capEnv, s, w *cuda.Stream) error { return e.onS.CopyFrom(e.onW, s) }},
		{"CopyBatch", func(e *capEnv, s, w *cuda.Stream) error {
			return buffer.CopyBatch(s, []buffer.Copy{{Dst: e.onS, Src: e.onW}})
		}},
		{"CopyFromHost", func(e *capEnv, s, w *cuda.Stream) error {
			return buffer.CopyFromHost(e.onS, make([]byte, e.onS.Size()), s)
		}},
		{"CopyToHost", func(e *capEnv, s, w *cuda.Stream) error {
			return buffer.CopyToHost(make([]byte, e.onS.Size()), e.onS, s)
		}},
		{"Buffer.WriteAt/pinned", func(e *capEnv, s, w *cuda.Stream) error { _, err := e.host.WriteAt([]byte{1, 2, 3}, 0); return err }},
		{"Buffer.Close", func(e *capEnv, s, w *cuda.Stream) error { return e.onS.Close() }},
		{"Buffer.CloseOn", func(e *capEnv, s, w *cuda.Stream) error { return e.onW.CloseOn(s) }},
		{"Buffer.CloseAfter", func(e *capEnv, s, w *cuda.Stream) error { return e.onS.CloseAfter(w) }},
		{"Buffer.Clone", func(e *capEnv, s, w *cuda.Stream) error { return e.keep(e.onW.Clone(e.pool, s)) }},
		// resource.
		{"DevicePool.Allocate", func(e *capEnv, s, w *cuda.Stream) error { return e.keep(e.pool.Allocate(kib, s)) }},
		{"DevicePool.Close/idle", func(e *capEnv, s, w *cuda.Stream) error {
			p, err := resource.NewDevicePool(e.d, &resource.DevicePoolOptions{MaxSize: 1 << 20})
			if err != nil {
				return fmt.Errorf("setup: %v", err) // not a capture outcome: fails the case
			}
			return p.Close()
		}},
		{"DevicePool.Close/last buffer", func(e *capEnv, s, w *cuda.Stream) error {
			// The pool was closed before the capture with onW live:
			// closing onW (on its own stream) destroys the pool.
			return e.onW.Close()
		}},
		{"PinnedPool.Allocate", func(e *capEnv, s, w *cuda.Stream) error { return e.keep(e.pinned.Allocate(kib, s)) }},
		{"PinnedPool.Close/idle", func(e *capEnv, s, w *cuda.Stream) error {
			p, err := resource.NewPinnedPool(&resource.PinnedPoolOptions{MaxSize: 1 << 20})
			if err != nil {
				return fmt.Errorf("setup: %v", err)
			}
			return p.Close()
		}},
		{"SubAllocator.Allocate", func(e *capEnv, s, w *cuda.Stream) error {
			// w's free range fits; taking it would order s after w.
			return e.keep(e.sub.Allocate(64*kib, s))
		}},
		{"SyncDevice.Allocate", func(e *capEnv, s, w *cuda.Stream) error { return e.keep(e.syncd.Allocate(kib, s)) }},
		{"Prefetch", func(e *capEnv, s, w *cuda.Stream) error {
			return resource.Prefetch(e.mgd, cuda.DeviceLocation(e.d), s)
		}},
		{"PrefetchBatch", func(e *capEnv, s, w *cuda.Stream) error {
			err := resource.PrefetchBatch([]*buffer.Buffer{e.mgd}, []cuda.MemLocation{cuda.DeviceLocation(e.d)}, s)
			if errors.Is(err, cuda.ErrInvalidArgument) && s.IsDefault() {
				return nil // the driver's batches refuse the legacy stream: refused as documented
			}
			return err
		}},
		{"GraphMemory.Allocate", func(e *capEnv, s, w *cuda.Stream) error {
			b, err := e.gm.Allocate(kib, s)
			if errors.Is(err, cuda.ErrInvalidArgument) && !s.IsCapturing() {
				return nil // graph memory exists only inside a capture: refused as documented
			}
			if err != nil {
				return err
			}
			return b.Close() // a free node in the same capture
		}},
	}
}

// capSituation says which stream captures, and which streams the
// operation gets.
type capSituation struct {
	name string
	// pick returns the operation's stream, the other stream it touches,
	// and the stream that captures.
	pick func(s, w, other, blocking *cuda.Stream, d *cuda.Device) (op, touched, capturer *cuda.Stream)
}

var capSituations = []capSituation{
	{"own stream captures", func(s, w, o, b *cuda.Stream, d *cuda.Device) (*cuda.Stream, *cuda.Stream, *cuda.Stream) {
		return s, w, s
	}},
	{"another stream captures", func(s, w, o, b *cuda.Stream, d *cuda.Device) (*cuda.Stream, *cuda.Stream, *cuda.Stream) {
		return s, w, o
	}},
	{"waited stream captures", func(s, w, o, b *cuda.Stream, d *cuda.Device) (*cuda.Stream, *cuda.Stream, *cuda.Stream) {
		return s, w, w
	}},
	{"legacy stream while a blocking stream captures", func(s, w, o, b *cuda.Stream, d *cuda.Device) (*cuda.Stream, *cuda.Stream, *cuda.Stream) {
		return d.DefaultStream(), w, b
	}},
	// The legacy stream is free while only non-blocking streams capture,
	// but it cannot join a capture by waiting on its work.
	{"legacy stream while the stream it waits on captures", func(s, w, o, b *cuda.Stream, d *cuda.Device) (*cuda.Stream, *cuda.Stream, *cuda.Stream) {
		return d.DefaultStream(), w, w
	}},
}

// Checks are what the driver in use can count: Baseline returns a check
// that the driver's objects are back to their counts, and Pools counts
// the pools that exist. Either may be nil.
type Checks struct {
	Baseline func(t *testing.T) func()
	Pools    func() int64
}

// Run runs every operation under every situation on d.
func Run(t *testing.T, d *cuda.Device, c Checks) {
	for _, op := range captureOps() {
		for _, sit := range capSituations {
			t.Run(op.name+"/"+sit.name, func(t *testing.T) {
				runCaptureCase(t, d, op, sit, c)
			})
		}
	}
}

func runCaptureCase(t *testing.T, d *cuda.Device, op capOp, sit capSituation, c Checks) {
	const kib = 1 << 10
	check := func() {}
	if c.Baseline != nil {
		check = c.Baseline(t)
	}
	var base int64
	if c.Pools != nil {
		base = c.Pools()
	}
	leaks := buffer.Leaks()
	mk := func(flags cuda.StreamFlags) *cuda.Stream {
		s, err := d.NewStreamWith(flags, 0)
		require.NoError(t, err)
		return s
	}
	s, w, o, b := mk(cuda.StreamNonBlocking), mk(cuda.StreamNonBlocking), mk(cuda.StreamNonBlocking), mk(0)
	opS, opW, capturer := sit.pick(s, w, o, b, d)

	e := &capEnv{t: t, d: d}
	defer func() {
		// A failed case closes what it made (every Close is idempotent),
		// so that its Buffers are not counted as the next case's leaks.
		if !t.Failed() {
			return
		}
		for _, j := range []*cuda.Stream{s, w, o, b, d.DefaultStream()} {
			if j.IsCapturing() {
				if g, err := j.EndCapture(); err == nil {
					g.Close()
				}
			}
		}
		for _, f := range e.later {
			f()
		}
		for _, bb := range []*buffer.Buffer{e.onS, e.onW, e.host, e.mgd} {
			bb.Close()
		}
		e.ev.Close()
		for _, c := range []interface{ Close() error }{e.sub, e.pool, e.pinned} {
			if c != nil {
				c.Close()
			}
		}
		for _, st := range []*cuda.Stream{s, w, o, b} {
			st.Close()
		}
	}()
	var err error
	e.pool, err = resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 64 << 20})
	require.NoError(t, err)
	e.pinned, err = resource.NewPinnedPool(&resource.PinnedPoolOptions{MaxSize: 64 << 20})
	require.NoError(t, err)
	e.sub, err = resource.NewSubAllocator(e.pool, &resource.SubAllocatorOptions{GrowSize: 256 * kib})
	require.NoError(t, err)
	e.syncd, err = resource.NewSyncDevice(d)
	require.NoError(t, err)
	e.gm, err = resource.NewGraphMemory(d)
	require.NoError(t, err)
	e.onS, err = e.pool.Allocate(kib, opS)
	require.NoError(t, err)
	e.onW, err = e.pool.Allocate(kib, opW)
	require.NoError(t, err)
	e.host, err = e.pinned.Allocate(kib, opS)
	require.NoError(t, err)
	mgd, err := resource.NewManaged(d, nil)
	require.NoError(t, err)
	e.mgd, err = mgd.Allocate(64*kib, opS)
	require.NoError(t, err)
	e.ev, err = d.NewEvent(cuda.EventDefault)
	require.NoError(t, err)
	require.NoError(t, e.ev.Record(opW))
	// A free range on w's list that fits the SubAllocator case.
	sb, err := e.sub.Allocate(64*kib, opW)
	require.NoError(t, err)
	require.NoError(t, sb.Close())
	require.NoError(t, d.Sync())
	if op.name == "DevicePool.Close/last buffer" {
		require.NoError(t, e.pool.Close())
	}

	require.NoError(t, capturer.BeginCapture())
	defer func() { // a failed case must not leave its capture to the next
		if capturer.IsCapturing() {
			if g, err := capturer.EndCapture(); err == nil {
				g.Close()
			}
		}
	}()
	var pools int64
	if c.Pools != nil {
		pools = c.Pools()
	}
	opErr := op.run(e, opS, opW)
	if opErr != nil && !errors.Is(opErr, cuda.ErrCapturing) {
		t.Errorf("%s: error that is not ErrCapturing: %v", op.name, opErr)
	}
	if opErr != nil {
		require.Contains(t, opErr.Error(), "captur", "the refusal says why")
	}
	// A stream the operation pulled into the capture (an explicit wait
	// forks it) is joined back before the capture ends, as CUDA requires.
	for _, j := range []*cuda.Stream{s, w, o, b} {
		if j != capturer && j.IsCapturing() {
			require.NoError(t, capturer.WaitStream(j), "joining %v back", j)
		}
	}
	g, err := capturer.EndCapture()
	require.NoError(t, err, "the capture must stay valid (operation error: %v)", opErr)
	require.NoError(t, g.Close())
	if c.Pools != nil {
		// A destruction the capture put off (a pool the operation made
		// and closed) has run when EndCapture returns: nothing to wait
		// for.
		require.LessOrEqual(t, c.Pools(), pools, "pools destroyed when EndCapture returned")
	}
	for _, j := range []*cuda.Stream{s, w, o, b, d.DefaultStream()} {
		require.False(t, j.IsCapturing(), "no stream captures after EndCapture")
	}

	// Everything works again, and is given back.
	for _, f := range e.later {
		require.NoError(t, f())
	}
	for _, bb := range []*buffer.Buffer{e.onS, e.onW, e.host, e.mgd} {
		require.NoError(t, bb.Close())
	}
	require.NoError(t, e.ev.Close())
	require.NoError(t, e.sub.Close())
	require.NoError(t, e.pool.Close())
	require.NoError(t, e.pinned.Close())
	for _, st := range []*cuda.Stream{s, w, o, b} {
		require.NoError(t, st.Close())
	}
	if c.Pools != nil {
		require.Equal(t, base, c.Pools(), "pools destroyed")
	}
	check()
	require.Equal(t, leaks, buffer.Leaks(), "no buffer leaked")
}
