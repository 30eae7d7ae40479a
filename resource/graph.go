package resource

import (
	"fmt"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// GraphMemory allocates graph memory (cuda.core's GraphMemoryResource):
// stream-ordered allocations made on a stream that is capturing a graph
// (cuda.Stream.BeginCapture), which become memory nodes of the graph.
// Each launch of the instantiated graph allocates the memory at the node,
// and frees it at the free node if the capture closed the Buffer too; the
// driver keeps a per-device cache of graph memory (see Attributes and
// Trim), apart from every memory pool.
//
//	s.BeginCapture()
//	tmp, _ := gm.Allocate(n, s) // an allocation node
//	// ... kernels and copies using tmp, on s ...
//	tmp.Close()                 // a free node: tmp is freed in the graph
//	g, _ := s.EndCapture()
//
// Allocate needs a capturing stream of the resource's device: any other
// is refused with an error matching cuda.ErrInvalidArgument, without a
// driver call. Closing a graph Buffer:
//   - inside the capture that allocated it (its own stream, or CloseOn a
//     stream of the same capture): a free node. The usual case.
//   - outside any capture: cuMemFreeAsync now, which frees what the last
//     launch left allocated; order it after that launch. Before any
//     launch, or once a launch of a graph instantiated with
//     cuda.GraphAutoFreeOnLaunch has freed it again, the memory is not
//     allocated: the driver's error is returned and the Buffer stays open
//     (Disown it if the graph frees it).
//   - inside another capture: a free node in that graph.
//
// A graph that leaves its allocation allocated cannot be launched again
// until it is freed, unless instantiated with cuda.GraphAutoFreeOnLaunch
// (each launch then frees the previous launch's memory first). Adaptors
// work over GraphMemory: they forward the stream, and the upstream judges
// it (the other resources refuse capturing streams with an error
// matching cuda.ErrCapturing). NewGraphMemory returns the same value for
// a device every time; there is nothing to close.
type GraphMemory struct {
	dev *cuda.Device
}

var graphMems sync.Map // device ordinal → *GraphMemory

// NewGraphMemory returns the graph memory resource of dev, the same value
// for the same device on every call.
func NewGraphMemory(dev *cuda.Device) (*GraphMemory, error) {
	const op = "NewGraphMemory"
	if err := checkDevice(op, dev); err != nil {
		return nil, err
	}
	if g, ok := graphMems.Load(dev.Ordinal()); ok {
		return g.(*GraphMemory), nil
	}
	// Graph memory belongs to the GPU: the value keeps the primary view,
	// so a view of another context (whose context may close) neither
	// shapes nor breaks it, and takes streams of any view of the GPU.
	g, _ := graphMems.LoadOrStore(dev.Ordinal(), &GraphMemory{dev: dev.Primary()})
	return g.(*GraphMemory), nil
}

func (g *GraphMemory) check(op string) error {
	if g == nil || g.dev == nil {
		return cuda.Errorf("GraphMemory."+op, cuda.ErrInvalidArgument, "GraphMemory is not initialized (get it with NewGraphMemory)")
	}
	return nil
}

// capturing checks that s is a capturing stream of g's device.
func (g *GraphMemory) capturing(op string, s *cuda.Stream) error {
	op = "GraphMemory." + op
	if s == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "GraphMemory cannot perform memory operations on a non-capturing stream (nil: the legacy default stream, which cannot capture)")
	}
	if _, err := g.dev.ResolveStream(op, s, true); err != nil {
		return err
	}
	if !s.IsCapturing() {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "GraphMemory cannot perform memory operations on a non-capturing stream (stream %#x of %v; begin a capture with Stream.BeginCapture)", s.Handle(), s.Device())
	}
	return nil
}

// Allocate adds an allocation node of size bytes to the graph s is
// capturing (cuMemAllocAsync); the Buffer's address is valid in the
// graph's later nodes, and for stream work ordered after a launch until
// the memory is freed (see the type's documentation). Size 0 returns an
// empty buffer, still only on a capturing stream.
func (g *GraphMemory) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(g, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]).
func (g *GraphMemory) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	const op = "Allocate"
	if err := g.check(op); err != nil {
		return 0, nil, err
	}
	if err := g.capturing(op, s); err != nil {
		return 0, nil, err
	}
	if err := checkSize("GraphMemory.Allocate", "size", size); err != nil {
		return 0, nil, err
	}
	if size == 0 {
		return 0, s, nil
	}
	p, err := s.MemAllocAsync(size)
	if err != nil {
		return 0, nil, &cuda.OpError{Op: "GraphMemory.Allocate", Err: fmt.Errorf("%d bytes of graph memory on %v: %w", size, g.dev, err)}
	}
	return p, s, nil
}

// Deallocate frees graph memory (cuMemFreeAsync): on a capturing stream
// it adds a free node to the graph; on any other stream of the device (nil:
// the legacy default stream) it frees, in stream order, the memory a
// launch left allocated (see the type's documentation). A zero ptr is a
// no-op. A failed free leaves the Buffer open.
func (g *GraphMemory) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "GraphMemory.Deallocate"
	if ptr == 0 {
		return nil
	}
	if err := g.check("Deallocate"); err != nil {
		return err
	}
	s, err := g.dev.ResolveStream(op, s, true)
	if err != nil {
		return err
	}
	if err := s.MemFreeAsync(ptr); err != nil {
		where := "outside a capture: is it allocated (the graph launched, and not freed since)?"
		if s.IsCapturing() {
			where = "as a free node of the capture"
		}
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%#x (%d bytes) %s: %w", uint64(ptr), size, where, err)}
	}
	return nil
}

// DeviceAccessible reports true.
func (g *GraphMemory) DeviceAccessible() bool { return true }

// HostAccessible reports false.
func (g *GraphMemory) HostAccessible() bool { return false }

// DeviceID is the device's ordinal (-1 for a nil or zero value).
func (g *GraphMemory) DeviceID() int {
	if g == nil || g.dev == nil {
		return -1
	}
	return g.dev.Ordinal()
}

// Device is the resource's device.
func (g *GraphMemory) Device() *cuda.Device {
	if g == nil {
		return nil
	}
	return g.dev
}

// String describes the resource for logs.
func (g *GraphMemory) String() string {
	if g == nil || g.dev == nil {
		return "GraphMemory(<nil>)"
	}
	return "GraphMemory(" + g.dev.String() + ")"
}

// Attributes reads the device's graph memory counters
// (cuDeviceGetGraphMemAttribute): used and reserved bytes, current and
// high watermarks. They cover every graph of the device, not only those
// allocated through this value (there is one per device anyway).
func (g *GraphMemory) Attributes() (a cuda.GraphMemAttributes, err error) {
	err = g.call("Attributes", func(d *cuda.Device) error {
		a, err = d.GraphMemAttributes()
		return err
	})
	return a, err
}

// ResetHighWatermarks sets both high watermarks back to 0 (the only value
// the driver accepts), so they track from now on.
func (g *GraphMemory) ResetHighWatermarks() error {
	return g.call("ResetHighWatermarks", (*cuda.Device).ResetGraphMemHighWatermarks)
}

// Trim gives the graph memory the device caches, and that no executing or
// scheduled graph uses, back to the system (cuDeviceGraphMemTrim).
func (g *GraphMemory) Trim() error {
	return g.call("Trim", (*cuda.Device).GraphMemTrim)
}

// call runs method op's driver call fn on g's device.
func (g *GraphMemory) call(op string, fn func(*cuda.Device) error) error {
	if err := g.check(op); err != nil {
		return err
	}
	if err := fn(g.dev); err != nil {
		return &cuda.OpError{Op: "GraphMemory." + op, Err: err}
	}
	return nil
}

// refuseCapture is the check every other resource makes on the streams of
// Allocate and Deallocate (see cuda.Stream.RefuseCapture): their memory is
// not graph memory, and their calls either are not recorded into a graph
// or make the host wait, which would invalidate the capture. One atomic
// load for streams made by cudamem.
func refuseCapture(op string, s *cuda.Stream) error {
	if err := s.RefuseCapture(op); err != nil {
		return fmt.Errorf("%w (use GraphMemory for allocations inside a capture)", err)
	}
	return nil
}
