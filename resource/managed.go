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
			err = fmt.Errorf("preferred location %s: %w", r.preferred.String(), err)
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
		return fmt.Sprintf("Managed(%v, preferred %s)", r.dev, r.preferred.String())
	}
	return fmt.Sprintf("Managed(%v)", r.dev)
}
