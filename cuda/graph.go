package cuda

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/internal/warn"
	"github.com/cudamem/cudamem/loader"
)

// Graph is a CUDA graph (CUgraph) captured from a stream (Stream.EndCapture).
// Instantiate it to launch it; Close destroys it (an instantiated
// GraphExec stays valid after its graph is closed). Methods are safe for
// concurrent use; use after Close returns an error matching ErrClosed.
//
// A graph with memory nodes (allocations made on the capturing stream by
// resource.GraphMemory) may have only one GraphExec at a time, a rule of
// the driver.
type Graph struct{ graphObj }

// GraphExec is an instantiated graph (CUgraphExec): Launch runs it on a
// stream, as often as needed. Close destroys it; the driver lets launches
// already submitted finish. Methods are safe for concurrent use.
type GraphExec struct {
	graphObj
	flags GraphInstantiateFlags
}

// graphObj is what Graph and GraphExec share: a driver object of one
// context, destroyed by Close or, when leaked, by the safety net.
type graphObj struct {
	dev     *Device
	handle  uintptr
	destroy *loader.Proc // cuGraphDestroy or cuGraphExecDestroy

	guard Guard // calls in flight, then Close
	// diedErr is what Close reports, each time, for an object closed
	// because Context.Close destroyed its green context first (diedWith);
	// nil otherwise. Written under the guard's Lock.
	diedErr error

	cleanup runtime.Cleanup
}

// GraphInstantiateFlags are CUgraphInstantiate_flags.
type GraphInstantiateFlags uint64

// Instantiate flags, with the values of CUgraphInstantiate_flags.
const (
	// GraphAutoFreeOnLaunch frees, at the start of each launch, the graph
	// memory a previous launch allocated and left unfreed (as if
	// cuMemFreeAsync were called on it). Without it, relaunching a graph
	// whose allocation is still live fails.
	GraphAutoFreeOnLaunch GraphInstantiateFlags = 1
	// GraphUpload uploads the graph at instantiation (only with
	// cuGraphInstantiateWithParams, which cudamem does not use: refused).
	GraphUpload GraphInstantiateFlags = 2
	// GraphDeviceLaunch makes the graph launchable from the device; it
	// cannot be combined with GraphAutoFreeOnLaunch.
	GraphDeviceLaunch GraphInstantiateFlags = 4
	// GraphUseNodePriority runs kernel nodes at their own priorities.
	GraphUseNodePriority GraphInstantiateFlags = 8
)

// graphLeaks counts graphs and execs freed by the safety net (not
// Close); tests read it through GraphLeaks.
var graphLeaks atomic.Int64

// GraphLeaks returns how many Graph and GraphExec values were garbage
// collected without Close (their driver objects were then destroyed by a
// cleanup). Tests assert it stays 0.
func GraphLeaks() int64 { return graphLeaks.Load() }

func newGraph(d *Device, ctx, h uintptr) *Graph {
	g := &Graph{graphObj{dev: d, handle: h, destroy: &d.drv.GraphDestroy}}
	g.arm(ctx)
	return g
}

// arm sets the safety net: a cleanup that captures raw values (context,
// handle) and the view, never the object. Once Context.Close destroyed
// the object's context the cleanup calls nothing: that context must not
// be made current again.
func (o *graphObj) arm(ctx uintptr) {
	d, p := o.dev, o.destroy
	o.cleanup = runtime.AddCleanup(o, func(v [2]uintptr) {
		graphLeaks.Add(1)
		if !d.contextClosedDone() {
			if r := p.CallCtx(v[0], v[1]); !ok(r) {
				warn.Failed("graph safety net: "+p.Name(), fail(p, r), "handle", fmt.Sprintf("%#x", v[1]), "device", d.String())
			}
		}
	}, [2]uintptr{ctx, o.handle})
}

// handleOrZero is the handle, 0 once closed.
func (o *graphObj) handleOrZero() uintptr {
	if o.guard.IsClosed() {
		return 0
	}
	return o.handle
}

// close destroys the object once (closeHandle); op names the operation in
// errors and what the object (graph or graph exec).
func (o *graphObj) close(op, what string) error {
	if o.dev == nil {
		return nil
	}
	err := closeHandle(&o.guard, o.dev, op, what, o.handle, &o.diedErr, func(ctx uintptr) error {
		if r := o.destroy.CallCtx(ctx, o.handle); !ok(r) {
			return &OpError{Op: op, Err: fail(o.destroy, r)}
		}
		return nil
	})
	if o.guard.IsClosed() {
		o.cleanup.Stop() // the safety net has nothing left to destroy
	}
	return err
}

func (g *Graph) begin(op string) (uintptr, uintptr, error) {
	if g == nil || g.dev == nil {
		return 0, 0, Errorf(op, ErrInvalidArgument, "nil or zero graph (make one with Stream.EndCapture)")
	}
	if !g.guard.Enter() {
		return 0, 0, &OpError{Op: op, Err: fmt.Errorf("%w: graph of %v", ErrClosed, g.dev)}
	}
	ctx, err := g.dev.contextFor(op)
	if err != nil {
		g.guard.Leave()
		return 0, 0, err
	}
	return ctx, g.handle, nil
}

// Device is the device whose context the graph was captured in (nil for
// a nil graph).
func (g *Graph) Device() *Device {
	if g == nil {
		return nil
	}
	return g.dev
}

// Handle is the CUgraph handle, 0 for a nil, zero or closed Graph.
func (g *Graph) Handle() uintptr {
	if g == nil {
		return 0
	}
	return g.handleOrZero()
}

// Instantiate makes an executable graph (cuGraphInstantiateWithFlags).
// Unknown flags, GraphUpload (meaningless here) and GraphDeviceLaunch
// with GraphAutoFreeOnLaunch are refused before the driver is called.
func (g *Graph) Instantiate(flags GraphInstantiateFlags) (*GraphExec, error) {
	const op = "Graph.Instantiate"
	const known = GraphAutoFreeOnLaunch | GraphUpload | GraphDeviceLaunch | GraphUseNodePriority
	switch {
	case flags&^known != 0:
		return nil, Errorf(op, ErrInvalidArgument, "unknown instantiate flags %#x", uint64(flags&^known))
	case flags&GraphUpload != 0:
		return nil, Errorf(op, ErrInvalidArgument, "GraphUpload needs cuGraphInstantiateWithParams; upload happens at the first launch instead")
	case flags&GraphDeviceLaunch != 0 && flags&GraphAutoFreeOnLaunch != 0:
		return nil, Errorf(op, ErrInvalidArgument, "GraphDeviceLaunch cannot be combined with GraphAutoFreeOnLaunch")
	}
	ctx, h, err := g.begin(op)
	if err != nil {
		return nil, err
	}
	defer g.guard.Leave()
	var eh uintptr
	p := &g.dev.drv.GraphInstantiateWithFlags
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&eh)), h, uintptr(flags)); !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("graph %#x of %v, flags %#x (a graph with memory nodes may have one instantiation at a time): %w", h, g.dev, uint64(flags), fail(p, r))}
	}
	if eh == 0 {
		return nil, zeroHandleErr(op, "cuGraphInstantiateWithFlags", fmt.Sprintf("exec handle for graph %#x", h))
	}
	e := &GraphExec{graphObj{dev: g.dev, handle: eh, destroy: &g.dev.drv.GraphExecDestroy}, flags}
	e.arm(ctx)
	return e, nil
}

// Close destroys the graph (cuGraphDestroy). It is idempotent; a nil or
// zero Graph has nothing to close. Execs instantiated from it stay valid.
// After Context.Close destroyed the graph's context, Close reports as
// Stream.Close does: close graphs before their context.
func (g *Graph) Close() error {
	if g == nil {
		return nil
	}
	return g.close("Graph.Close", "graph")
}

// Device is the device the exec belongs to (nil for a nil exec).
func (e *GraphExec) Device() *Device {
	if e == nil {
		return nil
	}
	return e.dev
}

// Flags are the flags the exec was instantiated with.
func (e *GraphExec) Flags() GraphInstantiateFlags {
	if e == nil {
		return 0
	}
	return e.flags
}

// Handle is the CUgraphExec handle, 0 for a nil, zero or closed exec.
func (e *GraphExec) Handle() uintptr {
	if e == nil {
		return 0
	}
	return e.handleOrZero()
}

// Launch runs the graph on s (cuGraphLaunch), ordered after the work
// already on s; work submitted to s afterwards waits for it. s must be a
// stream of the exec's device (the legacy default stream included).
func (e *GraphExec) Launch(s *Stream) error {
	const op = "GraphExec.Launch"
	if e == nil || e.dev == nil {
		return Errorf(op, ErrInvalidArgument, "nil or zero graph exec (make one with Graph.Instantiate)")
	}
	ctx, sh, err := s.begin(op)
	if err != nil {
		return err
	}
	defer s.end()
	if s.dev != e.dev {
		return Errorf(op, ErrInvalidArgument, "graph exec of %s launched on %s of %s", e.dev.contextName(), s.name(), s.dev.contextName())
	}
	if !e.guard.Enter() {
		return &OpError{Op: op, Err: fmt.Errorf("%w: graph exec of %v", ErrClosed, e.dev)}
	}
	defer e.guard.Leave()
	p := &e.dev.drv.GraphLaunch
	if r := p.CallCtx(ctx, e.handle, sh); !ok(r) {
		return &OpError{Op: op, Err: fmt.Errorf("exec %#x on stream %#x of %v: %w", e.handle, sh, e.dev, fail(p, r))}
	}
	return nil
}

// Close destroys the exec (cuGraphExecDestroy). It is idempotent.
// Graph memory a launch allocated and left unfreed stays allocated: free
// it through its Buffer, or the device keeps it. After Context.Close
// destroyed the exec's context, Close reports as Graph.Close does.
func (e *GraphExec) Close() error {
	if e == nil {
		return nil
	}
	return e.close("GraphExec.Close", "graph exec")
}

// GraphMemAttributes are a device's graph memory counters: memory the
// driver holds for graph allocation nodes, apart from every memory pool.
type GraphMemAttributes struct {
	// UsedCurrent is the physical memory mapped into graphs' allocations,
	// part of ReservedCurrent; UsedHigh is its high watermark.
	UsedCurrent, UsedHigh uint64
	// ReservedCurrent is the memory reserved for graphs (what GraphMemTrim
	// can give back); ReservedHigh is its high watermark.
	ReservedCurrent, ReservedHigh uint64
}

// graphMemAttrNames name the CUgraphMem_attribute values 0 to 3, the
// fields of GraphMemAttributes in order.
var graphMemAttrNames = [...]string{"used current", "used high", "reserved current", "reserved high"}

// graphMemUsedHigh and graphMemReservedHigh are the two counters that can
// be written (to 0, restarting them).
const graphMemUsedHigh, graphMemReservedHigh = 1, 3

// GraphMemAttributes reads the device's graph memory counters
// (cuDeviceGetGraphMemAttribute).
func (d *Device) GraphMemAttributes() (GraphMemAttributes, error) {
	const op = "Device.GraphMemAttributes"
	ctx, err := d.contextFor(op)
	if err != nil {
		return GraphMemAttributes{}, err
	}
	var v [len(graphMemAttrNames)]uint64
	p := &d.drv.DeviceGetGraphMemAttribute
	for a := range v {
		if r := p.CallCtx(ctx, uintptr(d.handle), uintptr(a), uintptr(unsafe.Pointer(&v[a]))); !ok(r) {
			return GraphMemAttributes{}, &OpError{Op: op, Err: fmt.Errorf("%s of %v: %w", graphMemAttrNames[a], d, fail(p, r))}
		}
	}
	return GraphMemAttributes{v[0], v[1], v[2], v[3]}, nil
}

// ResetGraphMemHighWatermarks resets both high watermarks to 0
// (cuDeviceSetGraphMemAttribute).
func (d *Device) ResetGraphMemHighWatermarks() error {
	const op = "Device.ResetGraphMemHighWatermarks"
	ctx, err := d.contextFor(op)
	if err != nil {
		return err
	}
	p := &d.drv.DeviceSetGraphMemAttribute
	for _, a := range []int{graphMemUsedHigh, graphMemReservedHigh} {
		var zero uint64
		if r := p.CallCtx(ctx, uintptr(d.handle), uintptr(a), uintptr(unsafe.Pointer(&zero))); !ok(r) {
			return &OpError{Op: op, Err: fmt.Errorf("%s of %v: %w", graphMemAttrNames[a], d, fail(p, r))}
		}
	}
	return nil
}

// GraphMemTrim gives the device's cached graph memory that no executing
// or scheduled graph uses back to the system (cuDeviceGraphMemTrim).
func (d *Device) GraphMemTrim() error {
	const op = "Device.GraphMemTrim"
	ctx, err := d.contextFor(op)
	if err != nil {
		return err
	}
	p := &d.drv.DeviceGraphMemTrim
	if r := p.CallCtx(ctx, uintptr(d.handle)); !ok(r) {
		return &OpError{Op: op, Err: fmt.Errorf("%v: %w", d, fail(p, r))}
	}
	return nil
}
