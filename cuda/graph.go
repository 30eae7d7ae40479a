package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

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
type Graph struct {
	dev    *Device
	handle uintptr

	mu     sync.RWMutex
	closed atomic.Bool // written under mu

	cleanup runtime.Cleanup
}

// GraphExec is an instantiated graph (CUgraphExec): Launch runs it on a
// stream, as often as needed. Close destroys it; the driver lets launches
// already submitted finish. Methods are safe for concurrent use.
type GraphExec struct {
	dev    *Device
	handle uintptr
	flags  GraphInstantiateFlags

	mu     sync.RWMutex
	closed atomic.Bool

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
	g := &Graph{dev: d, handle: h}
	g.cleanup = runtime.AddCleanup(g, destroyLeaked(d, &d.drv.GraphDestroy), [2]uintptr{ctx, h})
	return g
}

// destroyLeaked is the safety net's destructor: it captures raw values
// (context, handle) and the view, never the Graph. A graph of a context
// destroyed since died with it, as Close knows: its context must not be
// made current again (the driver may have reused the address).
func destroyLeaked(d *Device, p *loader.Proc) func([2]uintptr) {
	return func(v [2]uintptr) {
		graphLeaks.Add(1)
		if d.contextGone() {
			return
		}
		p.CallCtx(v[0], v[1])
	}
}

func (g *Graph) begin(op string) (uintptr, uintptr, error) {
	if g == nil || g.dev == nil {
		return 0, 0, Errorf(op, ErrInvalidArgument, "nil or zero graph (make one with Stream.EndCapture)")
	}
	g.mu.RLock()
	if g.closed.Load() {
		g.mu.RUnlock()
		return 0, 0, &OpError{Op: op, Err: fmt.Errorf("%w: graph of %v", ErrClosed, g.dev)}
	}
	ctx, err := g.dev.contextFor(op)
	if err != nil {
		g.mu.RUnlock()
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
	if g == nil || g.closed.Load() {
		return 0
	}
	return g.handle
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
	defer g.mu.RUnlock()
	var eh uintptr
	p := &g.dev.drv.GraphInstantiateWithFlags
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&eh)), h, uintptr(flags)); !ok(r) {
		return nil, &OpError{Op: op, Err: fmt.Errorf("graph %#x of %v, flags %#x (a graph with memory nodes may have one instantiation at a time): %w", h, g.dev, uint64(flags), fail(p, r))}
	}
	e := &GraphExec{dev: g.dev, handle: eh, flags: flags}
	e.cleanup = runtime.AddCleanup(e, destroyLeaked(g.dev, &g.dev.drv.GraphExecDestroy), [2]uintptr{ctx, eh})
	return e, nil
}

// Close destroys the graph (cuGraphDestroy). It is idempotent; a nil or
// zero Graph has nothing to close. Execs instantiated from it stay valid.
func (g *Graph) Close() error {
	if g == nil || g.dev == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Load() {
		return nil
	}
	if g.dev.contextGone() { // destroyed with its context
		g.cleanup.Stop()
		g.closed.Store(true)
		return nil
	}
	ctx, err := g.dev.contextFor("Graph.Close")
	if err != nil {
		return err
	}
	p := &g.dev.drv.GraphDestroy
	if r := p.CallCtx(ctx, g.handle); !ok(r) {
		return &OpError{Op: "Graph.Close", Err: fail(p, r)}
	}
	g.cleanup.Stop()
	g.closed.Store(true)
	return nil
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
	if e == nil || e.closed.Load() {
		return 0
	}
	return e.handle
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
		return Errorf(op, ErrInvalidArgument, "graph of %v launched on a stream of %v", e.dev, s.dev)
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed.Load() {
		return &OpError{Op: op, Err: fmt.Errorf("%w: graph exec of %v", ErrClosed, e.dev)}
	}
	p := &e.dev.drv.GraphLaunch
	if r := p.CallCtx(ctx, e.handle, sh); !ok(r) {
		return &OpError{Op: op, Err: fmt.Errorf("exec %#x on stream %#x of %v: %w", e.handle, sh, e.dev, fail(p, r))}
	}
	return nil
}

// Close destroys the exec (cuGraphExecDestroy). It is idempotent.
// Graph memory a launch allocated and left unfreed stays allocated: free
// it through its Buffer, or the device keeps it.
func (e *GraphExec) Close() error {
	if e == nil || e.dev == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return nil
	}
	if e.dev.contextGone() { // destroyed with its context
		e.cleanup.Stop()
		e.closed.Store(true)
		return nil
	}
	ctx, err := e.dev.contextFor("GraphExec.Close")
	if err != nil {
		return err
	}
	p := &e.dev.drv.GraphExecDestroy
	if r := p.CallCtx(ctx, e.handle); !ok(r) {
		return &OpError{Op: "GraphExec.Close", Err: fail(p, r)}
	}
	e.cleanup.Stop()
	e.closed.Store(true)
	return nil
}

// GraphMemAttribute is a CUgraphMem_attribute: a device's graph memory
// counters (memory the driver holds for graph allocation nodes, apart
// from every memory pool).
type GraphMemAttribute int32

// Graph memory attributes, with the values of CUgraphMem_attribute.
const (
	// GraphMemUsedCurrent: bytes of physical memory currently mapped
	// into graphs' allocations (what the driver calls "associated with
	// graphs"); part of GraphMemReservedCurrent.
	GraphMemUsedCurrent GraphMemAttribute = 0
	// GraphMemUsedHigh: high watermark of the memory mapped into graphs
	// (GraphMemUsedCurrent).
	GraphMemUsedHigh GraphMemAttribute = 1
	// GraphMemReservedCurrent: bytes reserved for graphs (what
	// Device.GraphMemTrim can give back).
	GraphMemReservedCurrent GraphMemAttribute = 2
	// GraphMemReservedHigh: high watermark of GraphMemReservedCurrent.
	GraphMemReservedHigh GraphMemAttribute = 3
)

func (a GraphMemAttribute) String() string {
	switch a {
	case GraphMemUsedCurrent:
		return "used current"
	case GraphMemUsedHigh:
		return "used high"
	case GraphMemReservedCurrent:
		return "reserved current"
	case GraphMemReservedHigh:
		return "reserved high"
	}
	return fmt.Sprintf("GraphMemAttribute(%d)", int32(a))
}

// GraphMemAttributes are all four graph memory counters of a device.
type GraphMemAttributes struct {
	UsedCurrent, UsedHigh, ReservedCurrent, ReservedHigh uint64
}

// GraphMemAttribute reads one graph memory counter
// (cuDeviceGetGraphMemAttribute).
func (d *Device) GraphMemAttribute(a GraphMemAttribute) (uint64, error) {
	const op = "Device.GraphMemAttribute"
	if a < GraphMemUsedCurrent || a > GraphMemReservedHigh {
		return 0, Errorf(op, ErrInvalidArgument, "unknown graph memory attribute %d", int32(a))
	}
	ctx, err := d.contextFor(op)
	if err != nil {
		return 0, err
	}
	var v uint64
	p := &d.drv.DeviceGetGraphMemAttribute
	if r := p.CallCtx(ctx, uintptr(d.handle), uintptr(a), uintptr(unsafe.Pointer(&v))); !ok(r) {
		return 0, &OpError{Op: op, Err: fmt.Errorf("%v of %v: %w", a, d, fail(p, r))}
	}
	return v, nil
}

// SetGraphMemAttribute writes a graph memory counter
// (cuDeviceSetGraphMemAttribute): only the high watermarks can be set, and
// only to 0, which restarts them; anything else is refused in Go.
func (d *Device) SetGraphMemAttribute(a GraphMemAttribute, v uint64) error {
	const op = "Device.SetGraphMemAttribute"
	if a != GraphMemUsedHigh && a != GraphMemReservedHigh {
		return Errorf(op, ErrInvalidArgument, "%v cannot be set (only the high watermarks can, to 0)", a)
	}
	if v != 0 {
		return Errorf(op, ErrInvalidArgument, "%v can only be reset to 0, not set to %d", a, v)
	}
	ctx, err := d.contextFor(op)
	if err != nil {
		return err
	}
	p := &d.drv.DeviceSetGraphMemAttribute
	if r := p.CallCtx(ctx, uintptr(d.handle), uintptr(a), uintptr(unsafe.Pointer(&v))); !ok(r) {
		return &OpError{Op: op, Err: fmt.Errorf("%v of %v: %w", a, d, fail(p, r))}
	}
	return nil
}

// GraphMemAttributes reads all four graph memory counters.
func (d *Device) GraphMemAttributes() (GraphMemAttributes, error) {
	var out GraphMemAttributes
	for _, f := range []struct {
		a   GraphMemAttribute
		dst *uint64
	}{
		{GraphMemUsedCurrent, &out.UsedCurrent},
		{GraphMemUsedHigh, &out.UsedHigh},
		{GraphMemReservedCurrent, &out.ReservedCurrent},
		{GraphMemReservedHigh, &out.ReservedHigh},
	} {
		v, err := d.GraphMemAttribute(f.a)
		if err != nil {
			return GraphMemAttributes{}, err
		}
		*f.dst = v
	}
	return out, nil
}

// ResetGraphMemHighWatermarks resets both high watermarks to 0.
func (d *Device) ResetGraphMemHighWatermarks() error {
	if err := d.SetGraphMemAttribute(GraphMemUsedHigh, 0); err != nil {
		return err
	}
	return d.SetGraphMemAttribute(GraphMemReservedHigh, 0)
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
