package resource

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// DevicePoolOptions ask NewDevicePool for a pool of its own (cuda.core's
// DeviceMemoryResourceOptions, with RMM's release threshold and initial
// size). The zero value is a valid set of options: an owned, non-IPC pool
// with the driver's default maximum size that keeps freed memory cached.
type DevicePoolOptions struct {
	// MaxSize caps the pool in bytes; 0 leaves it to the driver (about the
	// device's memory).
	MaxSize uint64
	// IPC makes the pool exportable to other processes as a POSIX file
	// descriptor (see package ipc). Linux only: elsewhere, and on devices
	// without the capability, NewDevicePool fails with cuda.ErrNotSupported.
	IPC bool
	// Fabric adds fabric handles (CU_MEM_HANDLE_TYPE_FABRIC) to the pool's
	// handle types, so package ipc can export it (ipc.ExportPoolFabric) to
	// processes on other nodes of a multi-node NVLink domain. It needs the IMEX service: without it NewDevicePool fails
	// with an error matching cuda.ErrNotSupported that names IMEX. It may
	// be set with or without IPC; either makes the pool IPC-enabled.
	Fabric bool
	// ReleaseThreshold is how many reserved bytes the pool keeps at
	// synchronization points. 0 means no limit: freed memory stays cached
	// for reuse (RMM's default), and Trim gives it back.
	ReleaseThreshold uint64
	// InitialReserve primes the pool: NewDevicePool allocates and frees
	// this many bytes, so the first allocations need not grow it. It must
	// not exceed MaxSize (when set) or ReleaseThreshold (when not 0).
	InitialReserve uint64
}

// check validates the options without a driver; goos is the target OS.
func (o *DevicePoolOptions) check(goos string) error {
	const op = "NewDevicePool"
	if o.IPC && goos != "linux" {
		return cuda.Errorf(op, cuda.ErrNotSupported, "IPC-enabled pools use POSIX file descriptors, available on Linux only (not %s)", goos)
	}
	return checkPoolSizes(op, o.InitialReserve, o.MaxSize, o.ReleaseThreshold)
}

// DevicePool allocates device memory from a CUDA memory pool, stream
// ordered (cuMemAllocFromPoolAsync / cuMemFreeAsync): cuda.core's
// DeviceMemoryResource, RMM's cuda_async_memory_resource. A pair costs a
// few hundred nanoseconds once the pool holds memory, against roughly
// 100 µs for cuMemAlloc/cuMemFree.
//
// A DevicePool either borrows the device's current pool
// (CurrentDevicePool; Close only stops this value's use) or owns a pool it
// created (NewDevicePool; Close revokes peer access and destroys it).
//
// Methods are safe for concurrent use. After Close every method except
// Deallocate returns an error matching cuda.ErrClosed; Deallocate keeps
// working for buffers that outlive the resource (see Close).
type DevicePool struct {
	core    poolCore
	peerMu  sync.Mutex         // serializes SetPeerAccess calls (Close waits for them through core.life)
	handles cuda.MemHandleType // the handle types it was created with (0 for a borrowed pool)
}

var _ buffer.MemoryResource = (*DevicePool)(nil)

// base is p's poolCore, nil for a nil p: its methods report a nil pool.
func (p *DevicePool) base() *poolCore {
	if p == nil {
		return nil
	}
	return &p.core
}

// CurrentDevicePool returns a resource over dev's current pool
// (cuDeviceGetMemPool), without owning it: Close ends only this value. A
// release threshold of 0 is raised to the maximum, so freed memory stays
// cached across synchronizations, as cuda.core does. It is cuda.core's
// DeviceMemoryResource(device), and what most programs want.
func CurrentDevicePool(dev *cuda.Device) (*DevicePool, error) {
	return newDevicePool("CurrentDevicePool", dev, nil)
}

// NewDevicePool creates a pool of dev's memory (cuMemPoolCreate) and owns
// it: Close destroys it once no buffer from it is live. Nil opts are the
// zero DevicePoolOptions (no size cap, no IPC, release threshold 0). To
// use the device's own pool instead, see CurrentDevicePool.
func NewDevicePool(dev *cuda.Device, opts *DevicePoolOptions) (*DevicePool, error) {
	if opts == nil {
		opts = &DevicePoolOptions{}
	}
	return newDevicePool("NewDevicePool", dev, opts)
}

// newDevicePool is both constructors: nil opts borrow the current pool.
func newDevicePool(op string, dev *cuda.Device, opts *DevicePoolOptions) (*DevicePool, error) {
	if opts != nil {
		if err := opts.check(runtime.GOOS); err != nil {
			return nil, err
		}
	}
	if err := checkDevice(op, dev); err != nil {
		return nil, err
	}
	f, err := dev.Features()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", dev, err)}
	}
	if !f.MemoryPools {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "%v does not support memory pools (use NewSyncDevice, or Default to pick)", dev)
	}
	if dev.Ordinal() < 0 || dev.Ordinal() > math.MaxInt32 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "device ordinal %d does not fit a memory location", dev.Ordinal())
	}
	p := &DevicePool{core: poolCore{kind: "DevicePool", dev: dev}}
	if opts == nil {
		pool, err := dev.CurrentMemPool()
		var t uint64
		if err == nil {
			t, err = pool.Attribute(cuda.MemPoolAttrReleaseThreshold)
		}
		if err == nil && t == 0 {
			err = pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, keepAll)
		}
		if err != nil {
			return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("current pool of %v: %w", dev, err)}
		}
		p.core.pool = pool
		return p, nil
	}
	if opts.IPC && !f.PoolIPC {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "%v cannot export memory pools as POSIX file descriptors", dev)
	}
	props := cuda.MemPoolProps{
		AllocType: cuda.MemAllocationTypePinned,
		Location:  cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(dev.Ordinal())},
		MaxSize:   opts.MaxSize,
	}
	if opts.IPC {
		props.HandleTypes = cuda.MemHandleTypePosixFileDescriptor
	}
	if opts.Fabric {
		// Asked first: a driver whose pools cannot take fabric handles may
		// answer cuMemPoolCreate with a bare CUDA_ERROR_INVALID_VALUE.
		v, err := dev.Attribute(cuda.DeviceAttrMemPoolSupportedHandleTypes)
		if err != nil {
			return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v pool handle types: %w", dev, err)}
		}
		if cuda.MemHandleType(v)&cuda.MemHandleTypeFabric == 0 {
			return nil, cuda.Errorf(op, cuda.ErrNotSupported, "%v's memory pools do not support fabric handles (supported handle types %#x); %s", dev, v, cuda.FabricRequirements)
		}
		props.HandleTypes |= cuda.MemHandleTypeFabric
	}
	pool, err := dev.CreateMemPool(&props)
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v: %w", dev, err)}
	}
	clean := true
	err = pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, threshold(opts.ReleaseThreshold))
	if err == nil {
		clean, err = prime(pool, dev.DefaultStream(), opts.InitialReserve)
	}
	if err != nil {
		// Nothing else holds the new pool: destroy it, so a failed
		// constructor leaves nothing behind.
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v: %w", dev, discard(pool, clean, err))}
	}
	p.core.pool, p.core.ipc, p.core.maxSize, p.handles = pool, opts.IPC || opts.Fabric, opts.MaxSize, props.HandleTypes
	p.core.own([]*cuda.Device{dev}, func() error {
		if err := p.revokePeers(); err != nil {
			return fmt.Errorf("revoke peer access: %w", err)
		}
		return pool.Destroy()
	})
	return p, nil
}

// Allocate returns a new buffer of size bytes, allocated in stream order
// on s (nil: the device's legacy default stream). The memory may be used
// on s at once, elsewhere after synchronizing with s. Closing the buffer
// frees it on s unless CloseOn names another stream. Size 0 returns an
// empty buffer without calling the driver.
func (p *DevicePool) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(p, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address (0 for size 0) and the stream it is ordered on (nil
// resolved to the default stream). The caller frees it with Deallocate.
func (p *DevicePool) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return p.base().allocatePtr("DevicePool", size, s, true)
}

// Deallocate frees memory from AllocatePtr in stream order on s (nil: the
// device's legacy default stream); a Buffer from Allocate frees its memory
// itself, when closed. A zero ptr is a no-op.
//
// It frees only addresses AllocatePtr handed out (or a Buffer's memory
// after Disown): anything else — another pool's memory, an address freed
// already, a live Buffer's memory (its Close frees it) — is refused with
// an error matching cuda.ErrInvalidArgument, without calling the driver,
// whose stream-ordered free would take memory of any pool.
func (p *DevicePool) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return p.base().deallocate("DevicePool", ptr, size, s, true)
}

// DeviceAccessible reports true and HostAccessible false: kernels on the
// device (and on peers granted access) can use the memory, the CPU not.
func (p *DevicePool) DeviceAccessible() bool { return true }
func (p *DevicePool) HostAccessible() bool   { return false }

// DeviceID is the ordinal of the pool's device (-1 for a nil or zero pool).
func (p *DevicePool) DeviceID() int { return p.Device().Ordinal() }

// Device is the pool's device.
func (p *DevicePool) Device() *cuda.Device {
	if p == nil {
		return nil
	}
	return p.core.dev
}

// Pool returns the driver memory pool, for packages that build on it
// (package ipc exports it). It is the zero MemPool once p is closed. Do not
// destroy it: Close does that for owned pools.
func (p *DevicePool) Pool() cuda.MemPool {
	return p.base().memPool()
}

// IsOwned reports whether p created its pool (and Close destroys it),
// rather than borrowing the device's current pool.
func (p *DevicePool) IsOwned() bool { return p != nil && p.core.life.Owned() }

// IsIPCEnabled reports whether the pool can be exported to other processes.
func (p *DevicePool) IsIPCEnabled() bool { return p != nil && p.core.ipc }

// HandleTypes returns the shareable handle types the pool was created with
// (POSIX fd with IPC, fabric with Fabric); 0 for a borrowed pool and for a
// nil one.
func (p *DevicePool) HandleTypes() cuda.MemHandleType {
	if p == nil {
		return 0
	}
	return p.handles
}

// IsClosed reports whether Close has been called (true for nil).
func (p *DevicePool) IsClosed() bool { return p == nil || p.core.life.IsClosed() }

// Attributes reads the pool's attributes from the driver.
func (p *DevicePool) Attributes() (PoolAttributes, error) {
	return p.base().attributes("DevicePool")
}

// SetReleaseThreshold sets how many reserved bytes the pool keeps at
// synchronization points (0: release all unused memory at every sync;
// math.MaxUint64: keep everything).
func (p *DevicePool) SetReleaseThreshold(n uint64) error {
	return p.base().set("DevicePool", "SetReleaseThreshold", cuda.MemPoolAttrReleaseThreshold, n)
}

// SetReuseFollowEventDependencies sets whether allocations may reuse memory
// freed on another stream once an event or stream dependency orders it.
func (p *DevicePool) SetReuseFollowEventDependencies(on bool) error {
	return p.base().set("DevicePool", "SetReuseFollowEventDependencies", cuda.MemPoolAttrReuseFollowEventDependencies, flagValue(on))
}

// SetReuseAllowOpportunistic sets whether allocations may reuse memory
// whose free has completed, with no dependency between them.
func (p *DevicePool) SetReuseAllowOpportunistic(on bool) error {
	return p.base().set("DevicePool", "SetReuseAllowOpportunistic", cuda.MemPoolAttrReuseAllowOpportunistic, flagValue(on))
}

// SetReuseAllowInternalDependencies sets whether the driver may insert
// stream dependencies to reuse memory freed on another stream.
func (p *DevicePool) SetReuseAllowInternalDependencies(on bool) error {
	return p.base().set("DevicePool", "SetReuseAllowInternalDependencies", cuda.MemPoolAttrReuseAllowInternalDependencies, flagValue(on))
}

// ResetHighWatermarks resets ReservedMemHigh and UsedMemHigh to 0 (the
// only value the driver accepts), so they track peaks from now on.
func (p *DevicePool) ResetHighWatermarks() error {
	return p.base().resetHighWatermarks("DevicePool")
}

// Trim gives cached memory back to the driver until the pool holds at
// most keep bytes (cuMemPoolTrimTo). Memory of live allocations, and of
// frees not yet observed by a synchronization, stays.
func (p *DevicePool) Trim(keep uint64) error {
	return p.base().trim("DevicePool", keep)
}

// deviceLoc is the location of device d.
func deviceLoc(d *cuda.Device) cuda.MemLocation {
	return cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())}
}

// peers returns the devices other than the pool's own that have any
// access to the pool now, asking the driver (changes made through another
// DevicePool on the same pool show). The caller holds the pool.
func (p *DevicePool) peers() ([]*cuda.Device, error) {
	all, err := cuda.Devices()
	if err != nil {
		return nil, err
	}
	var out []*cuda.Device
	for _, d := range all {
		if d.SameGPU(p.core.dev) { // the pool's own GPU, whatever view made it
			continue
		}
		f, err := p.core.pool.Access(deviceLoc(d))
		if err != nil {
			return nil, fmt.Errorf("access of %v: %w", d, err)
		}
		if f != cuda.MemAccessProtNone {
			out = append(out, d)
		}
	}
	return out, nil
}

// PeerAccess returns the ordinals of the other devices that may access the
// pool's memory, sorted, as the driver reports them now.
func (p *DevicePool) PeerAccess() ([]int, error) {
	if err := p.base().acquire("DevicePool", "PeerAccess"); err != nil {
		return nil, err
	}
	defer p.core.life.Leave()
	ds, err := p.peers()
	if err != nil {
		return nil, p.core.opErr("PeerAccess", err)
	}
	out := make([]int, 0, len(ds))
	for _, d := range ds {
		out = append(out, d.Ordinal())
	}
	slices.Sort(out)
	return out, nil
}

// SetPeerAccess makes exactly the listed devices (besides the pool's own)
// able to read and write the pool's memory: it grants read-write access
// to each listed peer and revokes it from every other device that has it,
// in one cuMemPoolSetAccess call. It applies to existing allocations too.
// SetPeerAccess() with no arguments revokes all peer access.
//
// Every peer must be able to access the pool's device (Device.CanAccessPeer);
// otherwise nothing changes and the error, matching cuda.ErrNotSupported,
// names the devices that cannot. Listing the pool's own device, whose
// access cannot change, is an error matching cuda.ErrInvalidArgument.
func (p *DevicePool) SetPeerAccess(peers ...*cuda.Device) error {
	const op = "SetPeerAccess"
	if err := p.base().acquire("DevicePool", op); err != nil {
		return err
	}
	defer p.core.life.Leave()
	own := p.core.dev
	want := make(map[*cuda.Device]bool, len(peers))
	var cannot []string
	for i, d := range peers {
		switch {
		case d == nil:
			return cuda.Errorf("DevicePool."+op, cuda.ErrInvalidArgument, "peer %d is nil", i)
		case d.SameGPU(own):
			return cuda.Errorf("DevicePool."+op, cuda.ErrInvalidArgument,
				"%v is the pool's own device: its access is always read-write and cannot be changed", d)
		}
		// Access is per GPU: views of one GPU through other contexts are
		// one peer.
		if pd := d.Primary(); pd != nil {
			d = pd
		}
		if want[d] {
			continue
		}
		want[d] = true
		can, err := d.CanAccessPeer(own)
		if err != nil {
			return p.core.opErr(op, fmt.Errorf("can %v access %v: %w", d, own, err))
		}
		if !can {
			cannot = append(cannot, d.String())
		}
	}
	if len(cannot) > 0 {
		return cuda.Errorf("DevicePool."+op, cuda.ErrNotSupported, "%s cannot access peer %v", strings.Join(cannot, ", "), own)
	}
	p.peerMu.Lock()
	defer p.peerMu.Unlock()
	have, err := p.peers()
	if err != nil {
		return p.core.opErr(op, err)
	}
	var descs []cuda.MemAccessDesc
	for d := range want {
		if !slices.Contains(have, d) {
			descs = append(descs, cuda.MemAccessDesc{Location: deviceLoc(d), Flags: cuda.MemAccessProtReadWrite})
		}
	}
	for _, d := range have {
		if !want[d] {
			descs = append(descs, cuda.MemAccessDesc{Location: deviceLoc(d), Flags: cuda.MemAccessProtNone})
		}
	}
	if err := p.core.pool.SetAccess(descs...); err != nil {
		return p.core.opErr(op, err)
	}
	return nil
}

// revokePeers removes every peer's access; Close calls it before
// destroying an owned pool.
func (p *DevicePool) revokePeers() error {
	have, err := p.peers()
	if err != nil {
		return err
	}
	descs := make([]cuda.MemAccessDesc, 0, len(have))
	for _, d := range have {
		descs = append(descs, cuda.MemAccessDesc{Location: deviceLoc(d), Flags: cuda.MemAccessProtNone})
	}
	return p.core.pool.SetAccess(descs...)
}

// Close ends the resource: every later call but Deallocate returns an
// error matching cuda.ErrClosed. An owned pool is destroyed, with its peer
// access revoked first, once no buffer from it is live and the device's
// work has finished: by Close when nothing is allocated, else by the
// Deallocate (Buffer.Close) of the last live buffer; as in cuda.core, a
// pool lives as long as its buffers do (the driver permits destroying it
// sooner, but a later synchronization can then crash the process). A
// borrowed pool is left as it is. Close is idempotent; if destroying the
// pool fails, Close (or, for a deferred destruction, the next Close)
// returns the error, and calling Close again retries.
//
// While one of the device's streams captures a graph, waiting for the
// device would invalidate the capture: the destruction is put off, and
// runs before the cuda.Stream.EndCapture (or Stream.Close) that ends the
// last such capture returns. Close waits for calls in progress on p (a
// Use callback among them) first; it must not be called from inside
// Use's callback.
func (p *DevicePool) Close() error {
	if p == nil || !p.core.initialized() {
		return nil
	}
	return p.core.close()
}

// Use runs fn with the driver pool held open: a concurrent Close waits for
// fn to return before it destroys the pool, so fn may make driver calls on
// it (package ipc exports the pool this way). It returns fn's error; an
// error matching cuda.ErrClosed once p is closed, without calling fn; and
// one matching cuda.ErrInvalidArgument for a nil or zero p or a nil fn.
// fn must not destroy the pool, keep it after returning, or Close p (Close
// would wait for fn); other calls on p from inside fn work.
func (p *DevicePool) Use(fn func(pool cuda.MemPool) error) error {
	return p.base().use("DevicePool", fn)
}

// String describes the resource for logs.
func (p *DevicePool) String() string {
	if p == nil || p.core.dev == nil {
		return "DevicePool(nil)"
	}
	kind := "current pool"
	if p.core.life.Owned() {
		kind = "owned pool"
	}
	if p.core.ipc {
		kind += ", IPC"
	}
	if p.IsClosed() {
		kind += ", closed"
	}
	return fmt.Sprintf("DevicePool(%v, %s)", p.core.dev, kind)
}
