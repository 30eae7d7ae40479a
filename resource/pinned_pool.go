package resource

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// PinnedPoolOptions configure NewPinnedPool (cuda.core's
// PinnedMemoryResourceOptions). The zero value asks for a plain host pool
// that keeps freed memory cached.
type PinnedPoolOptions struct {
	// NUMANode places the memory on a host NUMA node. nil means plain
	// host memory, except with IPC (plain host pools cannot be exported),
	// where it means the NUMA node nearest device 0 (or node 0 when the
	// driver does not say), rather than always node 0 (as cuda.core does).
	NUMANode *int
	// IPC makes the pool exportable to other processes as a POSIX file
	// descriptor. Linux only.
	IPC bool
	// MaxSize caps the pool in bytes; 0 leaves it to the driver.
	MaxSize uint64
	// ReleaseThreshold is how many reserved bytes the pool keeps at
	// synchronization points; 0 means no limit (keep freed memory cached).
	ReleaseThreshold uint64
	// InitialReserve primes the pool: NewPinnedPool allocates and frees
	// this many bytes, so the first allocations need not grow it. It must
	// not exceed MaxSize (when set) or ReleaseThreshold (when not 0).
	InitialReserve uint64
}

// check validates the options without a driver; goos is the target OS.
func (o *PinnedPoolOptions) check(goos string) error {
	const op = "NewPinnedPool"
	if o.NUMANode != nil && *o.NUMANode < 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "negative NUMANode %d (leave it nil for plain host memory)", *o.NUMANode)
	}
	if o.NUMANode != nil && *o.NUMANode > math.MaxInt32 {
		// The driver's location ID is 32 bits: a larger node would
		// become another node (2^32 would become node 0).
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "NUMANode %d exceeds the largest node ID the driver takes (%d)", *o.NUMANode, math.MaxInt32)
	}
	if err := checkPoolSizes(op, o.InitialReserve, o.MaxSize, o.ReleaseThreshold); err != nil {
		return err
	}
	if o.IPC && goos != "linux" {
		return cuda.Errorf(op, cuda.ErrNotSupported, "IPC-enabled pools use POSIX file descriptors, available on Linux only (not %s)", goos)
	}
	return nil
}

// Driver versions that accept host-location pools.
const (
	minDriverHostPool     = 13000 // CU_MEM_LOCATION_TYPE_HOST pools
	minDriverHostNUMAPool = 12060 // CU_MEM_LOCATION_TYPE_HOST_NUMA pools
)

// PinnedPool allocates page-locked host memory from a CUDA memory pool
// with a host location, stream ordered: cuda.core's PinnedMemoryResource.
// The CPU (under unified addressing, Buffer.Ptr is the host address) and
// every device may read and write it. A pool pair costs about a
// microsecond, a cuMemHostAlloc/cuMemFreeHost pair about a millisecond.
//
// The pool is owned: Close destroys it. Calls on the pool run in device
// 0's context; the nil stream is device 0's legacy default stream. Methods
// are safe for concurrent use; after Close they return errors matching
// cuda.ErrClosed, except Deallocate (see DevicePool).
type PinnedPool struct {
	core poolCore
	loc  cuda.MemLocation
}

var _ buffer.MemoryResource = (*PinnedPool)(nil)

// base is p's poolCore, nil for a nil p: its methods report a nil pool.
func (p *PinnedPool) base() *poolCore {
	if p == nil {
		return nil
	}
	return &p.core
}

// NewPinnedPool creates a pinned host memory pool. nil opts means the
// zero options. A driver or device without host-location pools (drivers
// before CUDA 12.6 for NUMA pools, 13.0 for plain host pools) gives an
// error matching cuda.ErrNotSupported.
func NewPinnedPool(opts *PinnedPoolOptions) (*PinnedPool, error) {
	const op = "NewPinnedPool"
	if opts == nil {
		opts = &PinnedPoolOptions{}
	}
	if err := opts.check(runtime.GOOS); err != nil {
		return nil, err
	}
	devs, err := cuda.Devices()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	if len(devs) == 0 {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "no CUDA devices")
	}
	dev := devs[0]
	f, err := dev.Features()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", dev, err)}
	}
	if !f.MemoryPools {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "%v does not support memory pools (use NewLegacyPinned)", dev)
	}
	if opts.IPC && !f.PoolIPC {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "%v cannot export memory pools as POSIX file descriptors", dev)
	}
	loc := cuda.MemLocation{Type: cuda.MemLocationTypeHost}
	switch {
	case opts.NUMANode != nil:
		loc = cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: int32(*opts.NUMANode)}
	case opts.IPC:
		node := f.HostNUMAID
		if node < 0 || node > math.MaxInt32 {
			node = 0 // the driver did not say (or said nonsense): node 0, as documented
		}
		loc = cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: int32(node)}
	}
	_, version, err := cuda.Driver()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	need := minDriverHostPool
	if loc.Type == cuda.MemLocationTypeHostNUMA {
		need = minDriverHostNUMAPool
	}
	if version < need {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "pools at %s need a CUDA %s driver (this one is %s)",
			loc.String(), cuda.VersionString(need), cuda.VersionString(version))
	}
	props := cuda.MemPoolProps{AllocType: cuda.MemAllocationTypePinned, Location: loc, MaxSize: opts.MaxSize}
	if opts.IPC {
		props.HandleTypes = cuda.MemHandleTypePosixFileDescriptor
	}
	pool, err := dev.CreateMemPool(&props)
	if err != nil {
		if errors.Is(err, cuda.ErrorInvalidValue) || errors.Is(err, cuda.ErrNotSupported) {
			// Drivers that reject host-location pools say INVALID_VALUE;
			// report it as the missing feature it is.
			return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%w: host memory pools rejected by the driver: %w", cuda.ErrNotSupported, err)}
		}
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	descs := make([]cuda.MemAccessDesc, len(devs))
	for i, d := range devs {
		descs[i] = cuda.MemAccessDesc{Location: deviceLoc(d), Flags: cuda.MemAccessProtReadWrite}
	}
	clean := true
	err = pool.SetAccess(descs...)
	if err == nil {
		err = pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, threshold(opts.ReleaseThreshold))
	}
	if err == nil {
		clean, err = prime(pool, dev.DefaultStream(), opts.InitialReserve)
	}
	if err != nil {
		// Nothing else holds the new pool: destroy it (access granted to
		// the devices goes with it).
		return nil, &cuda.OpError{Op: op, Err: discard(pool, clean, err)}
	}
	p := &PinnedPool{core: poolCore{kind: "PinnedPool", dev: dev, pool: pool, ipc: opts.IPC, maxSize: opts.MaxSize}, loc: loc}
	// Frees may have been ordered on any device's streams.
	p.core.own(devs, pool.Destroy)
	return p, nil
}

// Allocate returns a new buffer of size bytes of pinned host memory,
// allocated in stream order on s (nil: device 0's legacy default stream).
// Synchronize with s before touching it from the CPU. Size 0 returns an
// empty buffer without calling the driver.
func (p *PinnedPool) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(p, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the address (0 for size 0) and the stream it is ordered on (nil
// resolved to the default stream). The caller frees it with Deallocate.
func (p *PinnedPool) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return p.base().allocatePtr("PinnedPool", size, s, true)
}

// Deallocate frees memory from AllocatePtr in stream order on s (nil:
// device 0's legacy default stream); what it refuses is as for
// [DevicePool.Deallocate].
func (p *PinnedPool) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	return p.base().deallocate("PinnedPool", ptr, size, s, true)
}

// DeviceAccessible and HostAccessible report true: every device and the
// CPU may read and write the memory.
func (p *PinnedPool) DeviceAccessible() bool { return true }
func (p *PinnedPool) HostAccessible() bool   { return true }

// DeviceID reports -1: pinned memory belongs to no device.
func (p *PinnedPool) DeviceID() int { return -1 }

// Location is where the memory lives: the host, or a host NUMA node.
func (p *PinnedPool) Location() cuda.MemLocation {
	if p == nil {
		return cuda.MemLocation{}
	}
	return p.loc
}

// Pool returns the driver memory pool (see DevicePool.Pool).
func (p *PinnedPool) Pool() cuda.MemPool {
	return p.base().memPool()
}

// IsIPCEnabled reports whether the pool can be exported to other processes.
func (p *PinnedPool) IsIPCEnabled() bool { return p != nil && p.core.ipc }

// IsClosed reports whether Close has been called (true for nil).
func (p *PinnedPool) IsClosed() bool { return p == nil || p.core.life.IsClosed() }

// Attributes reads the pool's attributes from the driver.
func (p *PinnedPool) Attributes() (PoolAttributes, error) {
	return p.base().attributes("PinnedPool")
}

// SetReleaseThreshold sets how many reserved bytes the pool keeps at
// synchronization points.
func (p *PinnedPool) SetReleaseThreshold(n uint64) error {
	return p.base().set("PinnedPool", "SetReleaseThreshold", cuda.MemPoolAttrReleaseThreshold, n)
}

// ResetHighWatermarks resets ReservedMemHigh and UsedMemHigh to 0.
func (p *PinnedPool) ResetHighWatermarks() error {
	return p.base().resetHighWatermarks("PinnedPool")
}

// Trim gives cached memory back until the pool holds at most keep bytes.
func (p *PinnedPool) Trim(keep uint64) error {
	return p.base().trim("PinnedPool", keep)
}

// Close ends the resource and destroys the pool, as [DevicePool.Close]
// does for an owned pool, once every device's work has finished.
func (p *PinnedPool) Close() error {
	if p == nil || !p.core.initialized() {
		return nil
	}
	return p.core.close()
}

// Use runs fn with the driver pool held open, as DevicePool.Use does:
// a concurrent Close waits for fn to return. Errors name PinnedPool.Use.
func (p *PinnedPool) Use(fn func(pool cuda.MemPool) error) error {
	return p.base().use("PinnedPool", fn)
}

// String describes the resource for logs.
func (p *PinnedPool) String() string {
	if p == nil || p.core.dev == nil {
		return "PinnedPool(nil)"
	}
	s := p.loc.String()
	if p.core.ipc {
		s += ", IPC"
	}
	if p.IsClosed() {
		s += ", closed"
	}
	return "PinnedPool(" + s + ")"
}
