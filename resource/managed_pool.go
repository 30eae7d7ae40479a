package resource

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// ManagedPoolOptions configure NewManagedPool (cuda.core's
// ManagedMemoryResourceOptions). The zero value asks for a pool with no
// preferred location that keeps freed memory cached. Managed pools cannot
// be exported to other processes, and the driver sizes them itself.
type ManagedPoolOptions struct {
	// PreferredLocation is where the driver should keep the pool's pages
	// (advice every allocation starts with): a device
	// (cuda.DeviceLocation), the host (cuda.HostLocation), a host NUMA
	// node (cuda.HostNUMALocation), or cuda.HostNUMACurrentLocation, which
	// a pool takes as the NUMA node nearest its device (the driver's
	// HostNUMAID; a driver that does not say is an error matching
	// cuda.ErrNotSupported), since a pool outlives the thread that made
	// it. The zero MemLocation leaves placement to the driver.
	PreferredLocation cuda.MemLocation
	// ReleaseThreshold is how many reserved bytes the pool keeps at
	// synchronization points; 0 means no limit (keep freed memory cached).
	ReleaseThreshold uint64
	// InitialReserve primes the pool: NewManagedPool allocates and frees
	// this many bytes, so the first allocations need not grow it. It must
	// not exceed ReleaseThreshold (when not 0).
	InitialReserve uint64
}

// minDriverManagedPool is the driver version that has managed pools.
const minDriverManagedPool = 13000

// ManagedPool allocates managed (unified) memory from a CUDA memory pool
// of managed allocation type, stream ordered (cuMemAllocFromPoolAsync):
// cuda.core's ManagedMemoryResource with options, RMM's
// cuda_async_managed_memory_resource. Its memory migrates between the
// host and the devices on demand, as [Managed]'s does; [Prefetch],
// [Advise], [Discard] and the batches steer it. A pair costs what a
// DevicePool pair does, against a synchronizing cuMemAllocManaged and
// cuMemFree for Managed.
//
// NewManagedPool makes and owns a pool: Close destroys it once no buffer
// from it is live. CurrentManagedPool borrows the driver's current one:
// Close ends only that value's use. Calls on the pool run in the context
// of the device it was made with; the nil stream is that device's legacy
// default stream, and streams of any device may order allocations.
// Methods are safe for concurrent use; after Close they return errors
// matching cuda.ErrClosed, except Deallocate (see DevicePool).
type ManagedPool struct {
	core poolCore
	loc  cuda.MemLocation
}

var _ buffer.MemoryResource = (*ManagedPool)(nil)

// base is p's poolCore, nil for a nil p: its methods report a nil pool.
func (p *ManagedPool) base() *poolCore {
	if p == nil {
		return nil
	}
	return &p.core
}

// CurrentManagedPool returns a resource over the driver's current pool of
// managed memory with no preferred location (cuMemGetMemPool, CUDA 13.0),
// without owning it: Close ends only this value. dev's context serves
// the calls. A release threshold of 0 is raised to the maximum, so freed
// memory stays cached, as CurrentDevicePool does. It is cuda.core's
// ManagedMemoryResource() without options. What it refuses is as for
// NewManagedPool.
func CurrentManagedPool(dev *cuda.Device) (*ManagedPool, error) {
	const op = "CurrentManagedPool"
	if err := checkManagedPools(op, dev); err != nil {
		return nil, err
	}
	pool, err := dev.CurrentMemPoolAt(cuda.MemLocation{}, cuda.MemAllocationTypeManaged)
	var t uint64
	if err == nil {
		t, err = pool.Attribute(cuda.MemPoolAttrReleaseThreshold)
	}
	if err == nil && t == 0 {
		err = pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, keepAll)
	}
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("current managed pool: %w", err)}
	}
	return &ManagedPool{core: poolCore{kind: "ManagedPool", dev: dev, pool: pool}}, nil
}

// checkManagedPools refuses, for op, a device and driver without managed
// pools, saying what is missing.
func checkManagedPools(op string, dev *cuda.Device) error {
	if err := checkDevice(op, dev); err != nil {
		return err
	}
	_, version, err := cuda.Driver()
	if err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	if version < minDriverManagedPool {
		return cuda.Errorf(op, cuda.ErrNotSupported, "managed memory pools need a CUDA %s driver (this one is %s); use NewManaged",
			cuda.VersionString(minDriverManagedPool), cuda.VersionString(version))
	}
	f, err := dev.Features()
	if err != nil {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", dev, err)}
	}
	switch {
	case !f.MemoryPools:
		return cuda.Errorf(op, cuda.ErrNotSupported, "%v does not support memory pools (use NewManaged)", dev)
	case !f.ManagedMemory:
		return cuda.Errorf(op, cuda.ErrNotSupported, "%v does not support managed memory", dev)
	case !f.ConcurrentManagedAccess:
		return cuda.Errorf(op, cuda.ErrNotSupported,
			"%v lacks concurrent managed access (the CPU and the device touching managed memory at once), which managed pools need; use NewManaged", dev)
	}
	return nil
}

// NewManagedPool creates a pool of managed memory (cuMemPoolCreate with
// CU_MEM_ALLOCATION_TYPE_MANAGED) served by dev's context, and owns it.
// nil opts are the zero ManagedPoolOptions. It needs a CUDA 13.0 driver
// and devices with concurrent managed access (the CPU and the GPUs may
// touch managed memory at once; not so on Windows, WSL and some
// platforms): otherwise, and where the driver refuses managed pools, the
// error matches cuda.ErrNotSupported and says why.
func NewManagedPool(dev *cuda.Device, opts *ManagedPoolOptions) (*ManagedPool, error) {
	const op = "NewManagedPool"
	if opts == nil {
		opts = &ManagedPoolOptions{}
	}
	if err := checkPoolSizes(op, opts.InitialReserve, 0, opts.ReleaseThreshold); err != nil {
		return nil, err
	}
	loc := opts.PreferredLocation
	if !loc.IsZero() {
		if err := checkLocation(op, "PreferredLocation", loc); err != nil {
			return nil, err
		}
	}
	if err := checkManagedPools(op, dev); err != nil {
		return nil, err
	}
	f, err := dev.Features()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", dev, err)}
	}
	switch loc.Type {
	case cuda.MemLocationTypeHostNUMACurrent:
		if f.HostNUMAID < 0 || f.HostNUMAID > math.MaxInt32 {
			return nil, cuda.Errorf(op, cuda.ErrNotSupported,
				"PreferredLocation %s: the driver does not say which host NUMA node is nearest %v (name the node with cuda.HostNUMALocation)", loc, dev)
		}
		loc = cuda.HostNUMALocation(int32(f.HostNUMAID))
	case cuda.MemLocationTypeDevice:
		if err := checkConcurrent(op, "PreferredLocation", loc); err != nil {
			return nil, err
		}
	}
	devs, err := cuda.Devices()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	props := cuda.MemPoolProps{AllocType: cuda.MemAllocationTypeManaged, Location: loc}
	pool, err := dev.CreateMemPool(&props)
	if err != nil {
		if errors.Is(err, cuda.ErrorInvalidValue) || errors.Is(err, cuda.ErrNotSupported) {
			return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%w: managed memory pools (preferred location %s) rejected by the driver: %w", cuda.ErrNotSupported, loc, err)}
		}
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	clean := true
	err = pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, threshold(opts.ReleaseThreshold))
	if err == nil {
		clean, err = prime(pool, dev.DefaultStream(), opts.InitialReserve)
	}
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: discard(pool, clean, err)}
	}
	p := &ManagedPool{core: poolCore{kind: "ManagedPool", dev: dev, pool: pool}, loc: loc}
	// Managed memory may be freed on any device's streams.
	p.core.own(devs, pool.Destroy)
	return p, nil
}

// Allocate returns a new buffer of size bytes of managed memory,
// allocated in stream order on s (nil: the pool device's legacy default
// stream). Synchronize with s before touching it from the CPU. Size 0
// returns an empty buffer without calling the driver.
func (p *ManagedPool) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(p, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address (0 for size 0) and the stream it is ordered on (nil
// resolved). The caller frees it with Deallocate.
func (p *ManagedPool) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return p.base().allocatePtr("ManagedPool", size, s, true)
}

// Deallocate frees memory from AllocatePtr in stream order on s (nil: the
// pool device's legacy default stream); what it refuses is as for
// [DevicePool.Deallocate].
func (p *ManagedPool) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return p.base().deallocate("ManagedPool", ptr, size, s, true)
}

// ForBuffers returns the pool as buffer.Allocate uses it: see
// [DevicePool.ForBuffers].
func (p *ManagedPool) ForBuffers() buffer.MemoryResource {
	if p == nil || p.core.kind == "" {
		return nil
	}
	return poolBuffers{&p.core}
}

// DeviceAccessible and HostAccessible report true: the devices and the
// CPU may use the memory.
func (p *ManagedPool) DeviceAccessible() bool { return true }
func (p *ManagedPool) HostAccessible() bool   { return true }

// DeviceID is the ordinal of the device whose context serves the pool (-1
// for a nil or zero pool).
func (p *ManagedPool) DeviceID() int { return p.Device().Ordinal() }

// Device is the device whose context serves the pool.
func (p *ManagedPool) Device() *cuda.Device {
	if p == nil {
		return nil
	}
	return p.core.dev
}

// IsOwned reports whether p created its pool (NewManagedPool), rather
// than borrowing the current one (CurrentManagedPool).
func (p *ManagedPool) IsOwned() bool { return p != nil && p.core.life.Owned() }

// PreferredLocation is the pool's preferred location as made: the zero
// MemLocation for none, a host NUMA node for HostNUMACurrentLocation.
func (p *ManagedPool) PreferredLocation() cuda.MemLocation {
	if p == nil {
		return cuda.MemLocation{}
	}
	return p.loc
}

// Pool returns the driver memory pool (see DevicePool.Pool).
func (p *ManagedPool) Pool() cuda.MemPool { return p.base().memPool() }

// PoolErr is Pool with an error (see DevicePool.PoolErr).
func (p *ManagedPool) PoolErr() (cuda.MemPool, error) { return p.base().poolErr("ManagedPool") }

// IsClosed reports whether Close has been called (true for nil).
func (p *ManagedPool) IsClosed() bool { return p == nil || p.core.life.IsClosed() }

// Attributes reads the pool's attributes from the driver.
func (p *ManagedPool) Attributes() (PoolAttributes, error) {
	return p.base().attributes("ManagedPool")
}

// SetReleaseThreshold sets how many reserved bytes the pool keeps at
// synchronization points.
func (p *ManagedPool) SetReleaseThreshold(n uint64) error {
	return p.base().set("ManagedPool", "SetReleaseThreshold", cuda.MemPoolAttrReleaseThreshold, n)
}

// ResetHighWatermarks resets ReservedMemHigh and UsedMemHigh to 0.
func (p *ManagedPool) ResetHighWatermarks() error {
	return p.base().resetHighWatermarks("ManagedPool")
}

// Trim gives cached memory back until the pool holds at most keep bytes.
func (p *ManagedPool) Trim(keep uint64) error { return p.base().trim("ManagedPool", keep) }

// Close ends the resource and destroys an owned pool, as
// [DevicePool.Close] does, once every device's work has finished; a
// borrowed pool is left as it is.
func (p *ManagedPool) Close() error {
	if p == nil || !p.core.initialized() {
		return nil
	}
	return p.core.close()
}

// CloseContext is Close that gives up waiting when ctx ends, as
// DevicePool.CloseContext.
func (p *ManagedPool) CloseContext(ctx context.Context) error {
	return p.base().closeContext(ctx)
}

// Use runs fn with the driver pool held open, as DevicePool.Use does.
// Errors name ManagedPool.Use.
func (p *ManagedPool) Use(fn func(pool cuda.MemPool) error) error {
	return p.base().use("ManagedPool", fn)
}

// String describes the resource for logs.
func (p *ManagedPool) String() string {
	if p == nil || p.core.dev == nil {
		return "ManagedPool(nil)"
	}
	s := fmt.Sprintf("ManagedPool(%v", p.core.dev)
	if !p.core.life.Owned() {
		s += ", current pool"
	}
	if !p.loc.IsZero() {
		s += ", preferred " + p.loc.String()
	}
	if p.IsClosed() {
		s += ", closed"
	}
	return s + ")"
}
