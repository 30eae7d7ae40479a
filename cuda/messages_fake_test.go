package cuda

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The messages that put two contexts side by side (an event recorded on a
// stream of another context, a stream wrapped on the wrong view, a kernel
// or graph launched on a stream of another context, a context made
// current) name each context by its handle, once, with what it is: no
// empty description, no handle said twice, no side left without one.
func TestContextMessagesNameEachHandleOnce(t *testing.T) {
	fk := newCtxFake(t, "13000")
	restore := useDevices(t, fk.devs)
	defer restore()
	d0, d1 := fk.devs[0], fk.devs[1]
	c, err := d0.NewContext(0)
	require.NoError(t, err)
	defer c.Close()
	v := c.Device()
	ctx0, err := d0.context()
	require.NoError(t, err)
	ctx1, err := d1.context()
	require.NoError(t, err)

	stream := func(d *Device) *Stream {
		s, err := d.NewStream()
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	event := func(d *Device) *Event {
		e, err := d.NewEvent(EventDisableTiming)
		require.NoError(t, err)
		t.Cleanup(func() { e.Close() })
		return e
	}
	s0, s1, sv := stream(d0), stream(d1), stream(v)
	wrap := func(d *Device, s *Stream) error { _, err := d.WrapStream(s.Handle()); return err }

	type msgCase struct {
		name    string
		err     error
		op      string
		handles []uintptr // each named exactly once
	}
	cases := []msgCase{
		{"record: view's event on a primary stream", event(v).Record(s0), "Event.Record", []uintptr{v.ctx, ctx0, s0.handle}},
		{"record: primary event on a view's stream", event(d0).Record(sv), "Event.Record", []uintptr{ctx0, v.ctx, sv.handle}},
		{"record: another GPU's stream", event(d0).Record(s1), "Event.Record", []uintptr{ctx0, ctx1, s1.handle}},
		{"record: a view's legacy stream", event(d0).Record(v.DefaultStream()), "Event.Record", []uintptr{ctx0, v.ctx}},
		{"wrap: a view's stream on the primary view", wrap(d0, sv), "Device.WrapStream", []uintptr{sv.handle, v.ctx, ctx0}},
		{"wrap: a primary stream on a view", wrap(v, s0), "Device.WrapStream", []uintptr{s0.handle, ctx0, v.ctx}},
		{"wrap: another GPU's stream", wrap(d1, sv), "Device.WrapStream", []uintptr{sv.handle, v.ctx, ctx1}},
	}
	// A kernel of a module of another context (the fake loads no
	// modules, so the Function is made by hand), and a graph exec.
	f := &Function{mod: &Module{dev: d0, handle: 1}, name: "k", handle: 1}
	cases = append(cases, msgCase{"launch: kernel on a view's stream", f.Launch(sv, Dim3{X: 1}, Dim3{X: 1}, 0), "cuLaunchKernel", []uintptr{ctx0, v.ctx, sv.handle}})
	require.NoError(t, s0.BeginCapture())
	g, err := s0.EndCapture()
	require.NoError(t, err)
	defer g.Close()
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	cases = append(cases, msgCase{"launch: graph on a view's stream", x.Launch(sv), "GraphExec.Launch", []uintptr{ctx0, v.ctx, sv.handle}})

	if unsafe.Sizeof(uintptr(0)) == 8 {
		gc, err := d0.NewGreenContext(8)
		require.NoError(t, err)
		defer gc.Close()
		gv := gc.Device()
		sg := stream(gv)
		cases = append(cases,
			msgCase{"record: green event on a primary stream", event(gv).Record(s0), "Event.Record", []uintptr{gv.ctx, gv.green(), ctx0, s0.handle}},
			msgCase{"wrap: a green stream on the primary view", wrap(d0, sg), "Device.WrapStream", []uintptr{sg.handle, gv.green(), ctx0}},
			msgCase{"wrap: a primary stream on a green view", wrap(gv, s0), "Device.WrapStream", []uintptr{s0.handle, ctx0, gv.ctx, gv.green()}},
		)
	}

	hexes := regexp.MustCompile(`0x[0-9a-f]+`)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.err, ErrInvalidArgument)
			msg := tc.err.Error()
			t.Log(msg)
			assert.Contains(t, msg, tc.op)
			seen := map[string]int{}
			for _, h := range hexes.FindAllString(msg, -1) {
				seen[h]++
			}
			for _, h := range tc.handles {
				require.NotZero(t, h)
				assert.Equal(t, 1, seen[fmt.Sprintf("%#x", h)], "%q names handle %#x once", msg, h)
			}
			for _, bad := range []string{"  ", "( ", " )", "()", "context )", "context (", "(context 0x"} {
				assert.NotContains(t, msg, bad, "%q", msg)
			}
			assert.False(t, strings.HasSuffix(msg, " "), "%q", msg)
		})
	}
}

// describeContext names a context cudamem has no view of by its handle.
func TestDescribeUnknownContext(t *testing.T) {
	assert.Equal(t, "context 0x1234", describeContext(0x1234))
	assert.Equal(t, "no context (a nil or zero Device)", (&Device{}).contextName())
}
