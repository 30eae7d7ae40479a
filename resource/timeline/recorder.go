package timeline

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/frames"
)

// RecorderOptions configures NewRecorder. A nil *RecorderOptions means
// the zero value.
type RecorderOptions struct {
	// Name is the Resource of the recorder's events, telling the layers
	// of a stack apart ("pool", "suballocator"); "" means the upstream's
	// type, such as "*resource.DevicePool".
	Name string
	// CaptureStacks records the call stack (up to 32 frames) of every
	// Allocate and Deallocate. It costs a runtime.Callers and one small
	// allocation per call; stacks are symbolized only by Log.Trace.
	CaptureStacks bool
}

// Recorder is a memory resource adaptor that records every allocation
// and free through it in a Log: time, size, address, stream, device, its
// name and optionally the call stack. Several Recorders may share a Log:
// one above and one below a resource.SubAllocator show the allocations
// inside the upstream blocks they are carved from.
//
// A Free is recorded before the upstream frees, so that another goroutine
// handed the same address records its Alloc after it. If the upstream's
// Deallocate fails, the allocation is recorded again (an Alloc at the same
// address): the memory is still held. Buffers from Allocate are owned by
// the Recorder, so that their Close is recorded. Recorder is safe for
// concurrent use.
type Recorder struct {
	up     buffer.MemoryResource
	log    *Log
	name   string
	stacks bool
}

var _ buffer.MemoryResource = (*Recorder)(nil)

// NewRecorder returns a Recorder allocating from upstream and recording
// into log; a nil log gets the Recorder a new Log of DefaultCapacity (see
// Recorder.Log). opts may be nil. A nil upstream makes every Allocate fail
// with an error matching cuda.ErrInvalidArgument.
func NewRecorder(upstream buffer.MemoryResource, log *Log, opts *RecorderOptions) *Recorder {
	if upstream != nil {
		if v := reflect.ValueOf(upstream); v.Kind() == reflect.Pointer && v.IsNil() {
			upstream = nil
		}
	}
	if log == nil {
		log = NewLog(0)
	}
	r := &Recorder{up: upstream, log: log}
	if opts != nil {
		r.name, r.stacks = opts.Name, opts.CaptureStacks
	}
	if r.name == "" && upstream != nil {
		r.name = fmt.Sprintf("%T", upstream)
	}
	return r
}

func errNoUpstream(op string) error {
	return cuda.Errorf("Recorder."+op, cuda.ErrInvalidArgument, "Recorder has no upstream resource (create it with NewRecorder over a non-nil resource)")
}

func (r *Recorder) callers() []uintptr {
	if !r.stacks {
		return nil
	}
	var pcs [frames.Depth]uintptr
	n := runtime.Callers(3, pcs[:]) // skip Callers, this method and its caller
	return slices.Clone(pcs[:n])
}

// Allocate allocates from the upstream and records the allocation (an
// empty one, at address 0, is not recorded: it owns nothing and is never
// freed). Upstream errors are returned unchanged.
func (r *Recorder) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// layers above the Recorder pass addresses and only the top one builds a
// Buffer. Free it with Deallocate.
func (r *Recorder) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if r == nil || r.up == nil || r.log == nil {
		return 0, nil, errNoUpstream("Allocate")
	}
	callers := r.callers()
	ptr, s, err := r.up.AllocatePtr(size, s)
	if err != nil {
		return 0, nil, err
	}
	if ptr != 0 {
		r.log.record(r.event(Alloc, ptr, size, s), callers)
	}
	return ptr, s, nil
}

// Deallocate records the free and frees through the upstream; if the
// upstream fails, the allocation is recorded again and the error
// returned. A zero ptr does nothing.
func (r *Recorder) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if r == nil || r.up == nil || r.log == nil {
		return errNoUpstream("Deallocate")
	}
	callers := r.callers()
	r.log.record(r.event(Free, ptr, size, s), callers)
	err := r.up.Deallocate(ptr, size, s)
	if err != nil && !errors.Is(err, buffer.ErrPartlyFreed) && !errors.Is(err, cuda.ErrInvalidArgument) {
		// Not freed: live again. (buffer.ErrPartlyFreed: the memory is
		// gone; cuda.ErrInvalidArgument: not the upstream's allocation,
		// a double free, say, so no live allocation is invented.)
		r.log.record(r.event(Alloc, ptr, size, s), callers)
	}
	return err
}

func (r *Recorder) event(k Kind, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) Event {
	return Event{Kind: k, Addr: uint64(ptr), Size: size, Stream: uint64(s.Handle()), Device: r.up.DeviceID(), Resource: r.name}
}

// Log is where the Recorder records (nil for nil).
func (r *Recorder) Log() *Log {
	if r == nil {
		return nil
	}
	return r.log
}

// Name is the Resource of the Recorder's events.
func (r *Recorder) Name() string {
	if r == nil {
		return ""
	}
	return r.name
}

// Upstream is the resource allocations come from (nil if none).
func (r *Recorder) Upstream() buffer.MemoryResource {
	if r == nil {
		return nil
	}
	return r.up
}

// DeviceAccessible and HostAccessible report the upstream's answers
// (false without one).
func (r *Recorder) DeviceAccessible() bool { return r != nil && r.up != nil && r.up.DeviceAccessible() }
func (r *Recorder) HostAccessible() bool   { return r != nil && r.up != nil && r.up.HostAccessible() }

// DeviceID is the upstream's device (-1 without an upstream).
func (r *Recorder) DeviceID() int {
	if r == nil || r.up == nil {
		return -1
	}
	return r.up.DeviceID()
}

// String describes the resource for logs.
func (r *Recorder) String() string {
	if r == nil || r.up == nil {
		return "Recorder(nil)"
	}
	return fmt.Sprintf("Recorder(%q, %d events, %v)", r.name, r.log.Len(), r.up)
}
