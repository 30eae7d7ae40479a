package resource

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// ManagedOptions configure NewManaged.
type ManagedOptions struct {
	// PreferredLocation, when set, is advised for every allocation
	// (MemAdviseSetPreferredLocation): where the driver should keep the
	// pages (a device, the host, or a host NUMA node).
	PreferredLocation *cuda.MemLocation
}

// Managed allocates managed (unified) memory with cuMemAllocManaged,
// attached globally, and frees it with cuMemFree after waiting for the
// stream: memory that migrates between the host and the devices on
// demand. Prefetch and Advise steer the migration.
//
// The CPU may touch the memory (Buffer.Ptr is a host address too) when no
// kernel that uses it is running, or at any time on devices with
// concurrent managed access (cuda.Device.Features). Managed holds no
// driver object, so it has no Close. It is safe for concurrent use.
type Managed struct {
	dev       *cuda.Device
	preferred *cuda.MemLocation
}

var _ buffer.MemoryResource = (*Managed)(nil)

// NewManaged returns a managed memory resource bound to dev (its context
// serves the calls; its legacy default stream is the nil stream). opts may
// be nil. A device without managed memory gives an error matching
// cuda.ErrNotSupported.
func NewManaged(dev *cuda.Device, opts *ManagedOptions) (*Managed, error) {
	const op = "NewManaged"
	r := &Managed{dev: dev}
	if opts != nil && opts.PreferredLocation != nil {
		loc := *opts.PreferredLocation
		if err := checkLocation(op, "PreferredLocation", loc); err != nil {
			return nil, err
		}
		r.preferred = &loc
	}
	if err := checkDevice(op, dev); err != nil {
		return nil, err
	}
	f, err := dev.Features()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", dev, err)}
	}
	if !f.ManagedMemory {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "%v does not support managed memory", dev)
	}
	return r, nil
}

// Allocate returns a new buffer of size bytes of managed memory. The
// allocation is synchronous; s (nil: the device's legacy default stream)
// is recorded as the stream Close frees on. Size 0 returns an empty buffer
// without calling the driver.
func (r *Managed) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address (0 for size 0) and the stream Close frees on (nil resolved).
func (r *Managed) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return syncAlloc("Managed", r.Device(), size, s, false, func() (cuda.DevicePtr, error) {
		p, err := r.dev.MemAllocManaged(size, cuda.MemAttachGlobal)
		if err != nil || r.preferred == nil {
			return p, err
		}
		if err := r.dev.MemAdvise(p, size, cuda.MemAdviseSetPreferredLocation, *r.preferred); err != nil {
			err = fmt.Errorf("preferred location %s: %w", locString(*r.preferred), err)
			// Undo the allocation; if that fails too, say the memory leaked.
			if ferr := r.dev.MemFree(p); ferr != nil {
				err = errors.Join(err, fmt.Errorf("free %#x (%d bytes) after the failure: %w (leaked)", uint64(p), size, ferr))
			}
			return 0, err
		}
		return p, nil
	})
}

// Deallocate waits for s (nil: the device's legacy default stream), then
// frees the memory. A zero ptr is a no-op.
func (r *Managed) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return syncFree("Managed", r.Device(), ptr, size, s, func() error { return r.dev.MemFree(ptr) })
}

// DeviceAccessible and HostAccessible report true: the devices and the
// CPU may use the memory.
func (r *Managed) DeviceAccessible() bool { return true }
func (r *Managed) HostAccessible() bool   { return true }

// DeviceID is the ordinal of the device the resource is bound to (-1 for
// a nil or zero value).
func (r *Managed) DeviceID() int { return r.Device().Ordinal() }

// Device is the device the resource is bound to.
func (r *Managed) Device() *cuda.Device {
	if r == nil {
		return nil
	}
	return r.dev
}

// String describes the resource for logs.
func (r *Managed) String() string {
	if r == nil || r.dev == nil {
		return "Managed(nil)"
	}
	if r.preferred != nil {
		return fmt.Sprintf("Managed(%v, preferred %s)", r.dev, locString(*r.preferred))
	}
	return fmt.Sprintf("Managed(%v)", r.dev)
}

// checkLocation validates a location given as argument name of op: a
// device that exists, the host, or a host NUMA node.
func checkLocation(op, name string, loc cuda.MemLocation) error {
	switch loc.Type {
	case cuda.MemLocationTypeDevice:
		if _, err := cuda.GetDevice(int(loc.ID)); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%s %s: %w", name, locString(loc), err)}
		}
	case cuda.MemLocationTypeHost, cuda.MemLocationTypeHostNUMACurrent:
	case cuda.MemLocationTypeHostNUMA:
		if loc.ID < 0 {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s: negative NUMA node %d", name, loc.ID)
		}
	default:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s: %s is not a device, host or host NUMA location", name, locString(loc))
	}
	return nil
}

// managedRange checks that b is an open buffer of managed memory and
// returns its address, size and the device whose context serves calls on
// it. A zero-size buffer returns size 0 and no device.
func managedRange(op string, b *buffer.Buffer) (cuda.DevicePtr, uint64, *cuda.Device, error) {
	if b == nil {
		return 0, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	ptr, size := b.Ptr(), b.Size()
	if ptr == 0 {
		if b.IsClosed() {
			return 0, 0, nil, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		}
		if size == 0 {
			return 0, 0, nil, nil
		}
		return 0, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer of %d bytes at address 0", size)
	}
	if size == 0 {
		return ptr, 0, nil, nil
	}
	info, err := cuda.QueryPointer(ptr)
	if err != nil {
		return 0, 0, nil, &cuda.OpError{Op: op, Err: fmt.Errorf("buffer %#x (%d bytes): %w", uint64(ptr), size, err)}
	}
	if !info.Managed {
		return 0, 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument,
			"buffer %#x (%d bytes) is not managed memory (allocate it from a Managed resource)", uint64(ptr), size)
	}
	if m, ok := b.Resource().(*Managed); ok && m != nil && m.dev != nil {
		return ptr, size, m.dev, nil
	}
	dev, err := cuda.GetDevice(info.Device)
	if err != nil {
		if dev, err = cuda.GetDevice(0); err != nil {
			return 0, 0, nil, &cuda.OpError{Op: op, Err: err}
		}
	}
	return ptr, size, dev, nil
}

// Prefetch migrates a managed buffer's pages toward loc (a device, the
// host or a host NUMA node), ordered on s: work queued on s afterwards
// finds them there. A nil s means the legacy default stream of the target
// device (of the buffer's device for host targets). A buffer that is not
// managed memory is an error matching cuda.ErrInvalidArgument; a closed
// one, cuda.ErrClosed.
func Prefetch(b *buffer.Buffer, loc cuda.MemLocation, s *cuda.Stream) error {
	const op = "Prefetch"
	if err := checkLocation(op, "target", loc); err != nil {
		return err
	}
	ptr, size, dev, err := managedRange(op, b)
	if err != nil || size == 0 {
		return err
	}
	if s == nil {
		s = dev.DefaultStream()
		if loc.Type == cuda.MemLocationTypeDevice {
			d, err := cuda.GetDevice(int(loc.ID))
			if err != nil {
				return &cuda.OpError{Op: op, Err: err}
			}
			s = d.DefaultStream()
		}
	}
	return useRange(op, b, ptr, func() error {
		if err := s.MemPrefetchAsync(ptr, size, loc); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("buffer %#x (%d bytes) to %s: %w", uint64(ptr), size, locString(loc), err)}
		}
		return nil
	})
}

// useRange runs call under b.Use, so that a concurrent Close cannot free
// the range at ptr (what managedRange returned) mid-call.
func useRange(op string, b *buffer.Buffer, ptr cuda.DevicePtr, call func() error) error {
	return b.Use(op, func(cur cuda.DevicePtr) error {
		if cur != ptr {
			return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		}
		return call()
	})
}

// adviceNames names the advice values for messages.
var adviceNames = map[cuda.MemAdvice]string{
	cuda.MemAdviseSetReadMostly:          "SetReadMostly",
	cuda.MemAdviseUnsetReadMostly:        "UnsetReadMostly",
	cuda.MemAdviseSetPreferredLocation:   "SetPreferredLocation",
	cuda.MemAdviseUnsetPreferredLocation: "UnsetPreferredLocation",
	cuda.MemAdviseSetAccessedBy:          "SetAccessedBy",
	cuda.MemAdviseUnsetAccessedBy:        "UnsetAccessedBy",
}

// Advise tells the driver how a managed buffer will be used
// (cuMemAdvise). loc is the preferred location for SetPreferredLocation
// and the accessing device or host for *AccessedBy. The driver documents
// loc as ignored for *ReadMostly and UnsetPreferredLocation, yet rejects
// an invalid one (CUDA_ERROR_INVALID_VALUE): pass the zero
// MemLocation there and Advise sends the buffer's device in its place. A
// buffer that is not managed memory is an error matching
// cuda.ErrInvalidArgument.
func Advise(b *buffer.Buffer, advice cuda.MemAdvice, loc cuda.MemLocation) error {
	const op = "Advise"
	name, known := adviceNames[advice]
	if !known {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "unknown advice %d", advice)
	}
	switch advice {
	case cuda.MemAdviseSetPreferredLocation, cuda.MemAdviseSetAccessedBy, cuda.MemAdviseUnsetAccessedBy:
		if err := checkLocation(op, name+" location", loc); err != nil {
			return err
		}
	}
	ptr, size, dev, err := managedRange(op, b)
	if err != nil || size == 0 {
		return err
	}
	switch advice {
	case cuda.MemAdviseSetReadMostly, cuda.MemAdviseUnsetReadMostly, cuda.MemAdviseUnsetPreferredLocation:
		if loc == (cuda.MemLocation{}) {
			loc = deviceLoc(dev)
		}
	}
	return useRange(op, b, ptr, func() error {
		if err := dev.MemAdvise(ptr, size, advice, loc); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%s for buffer %#x (%d bytes), %s: %w", name, uint64(ptr), size, locString(loc), err)}
		}
		return nil
	})
}
