package dlpack

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Where exported tensors live.
//
// The consumer keeps the tensor's address until it calls the deleter, so
// the struct must stay put and allocated. It is Go memory pinned with
// runtime.Pinner and kept reachable from the registry below until the
// deleter runs, rather than libc malloc: that needs no C library found by
// name, and every field is a plain integer (uintptr, not a Go pointer), so
// whatever a consumer writes there cannot confuse the collector. The shape
// array is part of the same pinned object.
//
// The deleter receives only the struct's address. It is checked against
// the registry before anything is read through it, and manager_ctx (the
// export's id) must match too, so a garbage pointer or a second call does
// nothing. A released struct is zeroed and kept, pinned, among the last
// quarantineLen released ones, so that a late second deleter call finds
// an address no live export has, instead of one a newer export reused.

// block is the pinned memory of one export: the consumer's struct M and
// the shape its tensor points at.
type block[M any] struct {
	m     M
	shape int64
}

type export struct {
	id   uintptr
	addr uintptr
	hold *buffer.Hold
	pin  runtime.Pinner
	v    *block[ManagedTensorVersioned] // one of v and u
	u    *block[ManagedTensor]
	// The fields of the pinned struct that Export fills and the deleter
	// checks and clears.
	ctx, deleter *uintptr
	tensor       *Tensor
}

const quarantineLen = 256

var reg struct {
	mu         sync.Mutex
	lastID     uintptr
	live       map[uintptr]*export // by the struct's address
	quarantine [quarantineLen]*export
	qnext      int
}

var strays, failedFrees atomic.Int64

// Live returns how many exported tensors are live: exported, and their
// deleter not yet called.
func Live() int {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	return len(reg.live)
}

// StrayDeletes counts the deleter calls that matched no live export: a
// second call for one tensor, an address that was never exported, or a
// tensor whose manager_ctx the consumer overwrote (that export stays live:
// its memory is never freed). Each did nothing.
func StrayDeletes() int64 { return strays.Load() }

// FailedFrees counts deleter calls that ended a Buffer's last hold after
// its Close and whose free then failed, on the close stream and on the
// resource's default stream: that memory stays allocated. A deleter has
// no caller to tell.
func FailedFrees() int64 { return failedFrees.Load() }

// ExportOption changes how Export describes the tensor.
type ExportOption func(*exportConfig)

type exportConfig struct {
	readOnly bool
}

// ReadOnly sets DLPACK_FLAG_BITMASK_READ_ONLY: the consumer must not
// write the memory. Only versioned tensors carry flags.
func ReadOnly() ExportOption { return func(c *exportConfig) { c.readOnly = true } }

// DeviceOf is the DLPack device of a buffer's memory, as cuda.core's
// Buffer.__dlpack_device__ reads it from the memory's accessibility:
// memory only kernels can use is {CUDA, the device's ordinal}; memory both
// kernels and the CPU can use (pinned host, managed) is {CUDAHost, 0};
// memory only the CPU can use is {CPU, 0}. Memory neither can use, and a
// nil, zero or closed buffer, is an error matching cuda.ErrInvalidArgument
// (cuda.ErrClosed once closed).
func DeviceOf(b *buffer.Buffer) (Device, error) { return deviceOf("dlpack.DeviceOf", b) }

func deviceOf(op string, b *buffer.Buffer) (Device, error) {
	if _, err := b.PtrErr(); err != nil {
		return Device{}, relabel(op, err)
	}
	dev, host := b.DeviceAccessible(), b.HostAccessible()
	if b.IsClosed() { // a Close between PtrErr and the accessors
		return Device{}, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	switch {
	case dev && !host:
		id := b.DeviceID()
		if id < 0 || id > math.MaxInt32 {
			return Device{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is device memory of no device (DeviceID %d)", b, id)
		}
		return Device{Type: CUDA, ID: int32(id)}, nil
	case dev && host:
		return Device{Type: CUDAHost}, nil
	case host:
		return Device{Type: CPU}, nil
	}
	return Device{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v: buffer is neither device-accessible nor host-accessible", b)
}

// relabel puts op on a buffer method's error, keeping what it matches.
func relabel(op string, err error) error {
	if oe, ok := err.(*cuda.OpError); ok {
		return &cuda.OpError{Op: op, Err: oe.Err}
	}
	return &cuda.OpError{Op: op, Err: err}
}

// Export describes b's memory as a DLPack tensor for a C library: a
// DLManagedTensorVersioned, 1-D, of b.Size() elements of type uint8
// (Byte), with no strides, byte offset 0, data at b's address (0 for an
// empty buffer, as the header asks), on the device DeviceOf gives. The
// consumer owns the tensor and calls its deleter, from any thread, when it
// no longer needs the memory. (cuda.core exports int8; uint8 is the type
// of a Go []byte, so the consumer sees the same values.)
//
// Until the deleter runs, b's memory stays allocated (Export takes a
// [buffer.Buffer.Hold]): Close of b returns nil and closes it for Go,
// and the deleter then frees the memory, on the stream Close was given;
// if the deleter runs first, Close frees as usual. A view exports its own
// range and holds its owner's memory. The consumer must have finished its
// work on the memory before it calls the deleter, as DLPack asks.
//
// The deleter does nothing for an address it did not hand out, or for a
// second call (see StrayDeletes). It does its work on a Go thread, so the
// caller's current CUDA context is left alone; it must not be called from
// a CUDA host function (cuLaunchHostFunc).
//
// Export works on linux/amd64 and linux/arm64, cgo or not, and elsewhere
// returns an error matching cuda.ErrNotSupported. A nil, zero or closed
// buffer, or one whose memory no one can use, is an error matching
// cuda.ErrInvalidArgument or cuda.ErrClosed.
func Export(b *buffer.Buffer, opts ...ExportOption) (*ManagedTensorVersioned, error) {
	e, err := newExport("dlpack.Export", b, true, opts)
	if err != nil {
		return nil, err
	}
	return &e.v.m, nil
}

// ExportUnversioned is Export for consumers that know only the
// unversioned DLManagedTensor (DLPack before 1.0). It carries no flags, so
// ReadOnly is an error matching cuda.ErrInvalidArgument.
func ExportUnversioned(b *buffer.Buffer, opts ...ExportOption) (*ManagedTensor, error) {
	e, err := newExport("dlpack.ExportUnversioned", b, false, opts)
	if err != nil {
		return nil, err
	}
	return &e.u.m, nil
}

func newExport(op string, b *buffer.Buffer, versioned bool, opts []ExportOption) (*export, error) {
	var cfg exportConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if !supported {
		return nil, unsupported(op)
	}
	if cfg.readOnly && !versioned {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "an unversioned DLManagedTensor has no flags to mark it read-only (use Export)")
	}
	dev, err := deviceOf(op, b)
	if err != nil {
		return nil, err
	}
	if b.Size() > math.MaxInt64 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v: %d bytes do not fit a DLPack shape (int64)", b, b.Size())
	}
	deleter := deleterAddr()
	if deleter == 0 {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "no C callback for the deleter")
	}
	h, err := b.Hold(op)
	if err != nil {
		return nil, err
	}
	data := uintptr(h.Ptr())
	if h.Size() == 0 {
		data = 0
	}
	e := &export{hold: h}

	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.lastID++
	e.id = reg.lastID
	var shape *int64
	if versioned {
		e.v = &block[ManagedTensorVersioned]{}
		e.pin.Pin(e.v)
		e.v.m.Version = Version{MajorVersion, MinorVersion}
		if cfg.readOnly {
			e.v.m.Flags = FlagReadOnly
		}
		e.ctx, e.deleter, e.tensor, shape = &e.v.m.ManagerCtx, &e.v.m.Deleter, &e.v.m.Tensor, &e.v.shape
		e.addr = uintptr(unsafe.Pointer(&e.v.m))
	} else {
		e.u = &block[ManagedTensor]{}
		e.pin.Pin(e.u)
		e.ctx, e.deleter, e.tensor, shape = &e.u.m.ManagerCtx, &e.u.m.Deleter, &e.u.m.Tensor, &e.u.shape
		e.addr = uintptr(unsafe.Pointer(&e.u.m))
	}
	*shape = int64(h.Size())
	*e.ctx, *e.deleter = e.id, deleter
	*e.tensor = Tensor{Data: data, Device: dev, NDim: 1, DType: Byte, Shape: uintptr(unsafe.Pointer(shape))}
	if reg.live == nil {
		reg.live = make(map[uintptr]*export)
	}
	reg.live[e.addr] = e
	return e, nil
}

// takeExport ends the export at addr for its deleter and returns its
// hold, or nil, doing nothing, unless addr is a live export whose
// manager_ctx is still its id. The quarantined struct keeps no hold: that
// would keep the Buffer, and its slab, reachable.
func takeExport(addr uintptr) *buffer.Hold {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	e := reg.live[addr]
	if e == nil || *e.ctx != e.id {
		strays.Add(1)
		return nil
	}
	delete(reg.live, addr)
	*e.ctx, *e.deleter, e.tensor.Data, e.tensor.Shape = 0, 0, 0, 0
	h := e.hold
	e.hold = nil
	if old := reg.quarantine[reg.qnext]; old != nil {
		old.pin.Unpin()
	}
	reg.quarantine[reg.qnext] = e
	reg.qnext = (reg.qnext + 1) % quarantineLen
	return h
}

// deleted is the deleter of every exported tensor, run by the C callback.
func deleted(self uintptr) {
	h := takeExport(self)
	if h == nil {
		return
	}
	// The release may free through the driver, which makes a context
	// current on its thread: do it on a Go thread, leaving the caller's
	// context alone, and wait, so the memory is freed when the deleter
	// returns.
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.Release(); err != nil {
			failedFrees.Add(1)
		}
	}()
	<-done
}
