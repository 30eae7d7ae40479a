package cuda

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// Objects of a green context still open when Context.Close destroyed it.
// CUDA does not destroy them with a green context: it leaks them and
// refuses every later call on them, and any call would first make the
// destroyed context current, on which a real driver may crash (the fake
// counts those as Crashes). So Close of a graph, graph exec, stream, event
// or module makes no driver call: it marks the object closed (Handle 0)
// and reports the leak with an error matching ErrClosed, the same error on
// every Close; a leaked graph's safety net calls nothing either. An object
// closed before its context still closes with nil, twice.
func TestGreenContextObjectsClosedAfterTheirContext(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) < 8 {
		t.Skip("green contexts need a 64-bit platform")
	}
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	c, err := fk.devs[0].NewGreenContext(8)
	require.NoError(t, err)
	v := c.Device()

	capture := func() *Graph {
		s, err := v.NewStream()
		require.NoError(t, err)
		require.NoError(t, s.BeginCapture())
		g, err := s.EndCapture()
		require.NoError(t, err)
		require.NoError(t, s.Close())
		return g
	}
	g := capture()
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	s, err := v.NewStream()
	require.NoError(t, err)
	e, err := v.NewEvent(EventDisableTiming)
	require.NoError(t, err)
	// The fake loads no modules; Close of this one must not reach the
	// driver anyway, which is what is checked.
	m := &Module{dev: v, handle: 0xdead}
	early, err := v.NewEvent(EventDisableTiming)
	require.NoError(t, err)
	require.NoError(t, early.Close())
	// A graph left to the safety net: nothing keeps it reachable.
	require.NotZero(t, capture().Handle())

	crashes := fk.stat.Stat(fakecuda.Crashes)
	leaks := GraphLeaks()
	require.NoError(t, c.Close())

	for _, o := range []struct {
		op     string
		close  func() error
		handle func() uintptr
	}{
		{"Graph.Close", g.Close, g.Handle},
		{"GraphExec.Close", x.Close, x.Handle},
		{"Stream.Close", s.Close, s.Handle},
		{"Event.Close", e.Close, e.Handle},
		{"Module.Close", m.Close, func() uintptr { return 0 }},
	} {
		err := o.close()
		require.ErrorIs(t, err, ErrClosed, o.op)
		assert.Contains(t, err.Error(), o.op)
		assert.Contains(t, err.Error(), "green context")
		assert.Contains(t, err.Error(), "leaked")
		again := o.close()
		require.ErrorIs(t, again, ErrClosed, "%s again", o.op)
		assert.Equal(t, err.Error(), again.Error(), "%s reports the same each time", o.op)
		assert.Zero(t, o.handle(), "%s: a closed object hands out no handle", o.op)
	}
	_, err = g.Instantiate(0)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, x.Launch(v.DefaultStream()), ErrClosed)
	_, err = m.Function("k")
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, early.Close(), "closed before its context: nil, as ever")

	// The leaked graph's safety net must not make the dead context current.
	require.Eventually(t, func() bool { runtime.GC(); return GraphLeaks() > leaks }, 5*time.Second, 10*time.Millisecond, "the safety net ran")
	assert.Equal(t, crashes, fk.stat.Stat(fakecuda.Crashes), "no driver call on the destroyed green context")
}

// Under an ordinary context (Device.NewContext) the driver destroyed the
// graphs with it: their Close after Context.Close makes no driver call
// and returns nil, every time, and the safety net calls nothing.
func TestGraphsClosedAfterTheirContext(t *testing.T) {
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	c, err := fk.devs[1].NewContext(0)
	require.NoError(t, err)
	v := c.Device()
	s, err := v.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.BeginCapture())
	g, err := s.EndCapture()
	require.NoError(t, err)
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	crashes := fk.stat.Stat(fakecuda.Crashes)
	require.NoError(t, c.Close())
	for i := 0; i < 2; i++ {
		assert.NoError(t, g.Close())
		assert.NoError(t, x.Close())
	}
	assert.Zero(t, g.Handle())
	assert.Zero(t, x.Handle())
	assert.Equal(t, crashes, fk.stat.Stat(fakecuda.Crashes))
}
