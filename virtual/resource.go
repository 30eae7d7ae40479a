package virtual

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Resource allocates VMM memory; see the package documentation. It is a
// buffer.MemoryResource and is safe for concurrent use.
type Resource struct {
	dev     *cuda.Device
	drv     driver
	opts    Options
	prop    cuda.MemAllocationProp
	gran    uint64
	align   uint64 // new ranges' alignment: gran, or AddrAlign where that is more
	reserve uint64 // Options.Reserve rounded up to the granularity
	descs   []cuda.MemAccessDesc

	// mu guards allocs. Lock order: a Buffer's lock, then mu (Close holds
	// the first while Deallocate takes the second), so no Buffer method
	// is called with mu held.
	mu     sync.Mutex
	allocs map[cuda.DevicePtr]*allocation

	left pending // what failed cleanups could not give back yet

	// phase serializes Sleep and Wake; taken before mu.
	phase sync.Mutex
	// spare is pinned host memory kept for the next Sleep: by a Wake with
	// WakeOptions.KeepHostBackup, or because freeing it failed (the next
	// free retries). spareMu, a leaf lock, guards it.
	spareMu sync.Mutex
	spare   []byte
	// copies is the stream Wake copies host backups back on (hasCopies:
	// made; the fake driver's is nil), under phase.
	copies    *cuda.Stream
	hasCopies bool
	stats     map[string]*SleepStats // per tag, under mu
}

// allocation is one live VMM allocation: physical chunks mapped back to back
// from base, inside address reservations that are contiguous from base.
//
// Invariants, between operations: the chunks cover [0, mapped) in order;
// mapped >= size rounded up to the granularity; mapped <= the reserved
// total. While asleep (sleep != nil), chunks is empty and mapped 0, and
// sleep says what to map again. An operation that fails restores them before it returns, or takes
// effect and hands what it could not give back to the resource's
// leftovers.
type allocation struct {
	base         cuda.DevicePtr
	size         uint64 // the size the user asked for
	mapped       uint64 // bytes mapped from base (a multiple of gran)
	reservations []span
	resv         uint64 // the reservations' total (kept, not summed: a grow step must not cost more as they add up)
	chunks       []chunk
	descs        []cuda.MemAccessDesc // access granted on every chunk
	// claimed is set while a Grow or Shrink (beginResize) or a Sleep or
	// Wake (claimLocked) owns the allocation: other changes are refused
	// meanwhile. It is a claim, not a cuda.Guard: a second claimant is
	// refused rather than let in, and the Deallocate that comes meanwhile
	// must not wait for it (a Grow or Shrink waits for that Deallocate's
	// Close in b.Disown), so it hands its free over instead (freeLater).
	claimed bool
	// tag selects the allocation for Sleep and Wake; sleep is its state
	// while asleep (nil when awake: then chunks are mapped).
	tag   string
	sleep *slept
	// shared says how other processes map the physical memory
	// ("exported", "imported"; "" if none): such memory cannot sleep.
	shared string
	// freeLater is set by a Deallocate that came while claimed was (a
	// Close of the buffer being resized or put to sleep, or the last
	// Release of a Hold of it): the claimant frees the allocation as it
	// ends, once it has undone its own work (see Deallocate and
	// endResizeLocked).
	freeLater bool
}

type span struct {
	ptr  cuda.DevicePtr
	size uint64
}

type chunk struct {
	off, size uint64
	h         cuda.MemHandle
}

// setReservations replaces a's reservations (nil for none).
func (a *allocation) setReservations(rs []span) {
	a.reservations = rs
	a.resv = 0
	for _, r := range rs {
		a.resv += r.size
	}
}

// New creates a VMM resource on dev (which also serves host-located
// memory). Invalid options are rejected with an error naming the option;
// missing device support returns an error matching cuda.ErrNotSupported.
func New(dev *cuda.Device, opts *Options) (*Resource, error) {
	if dev == nil {
		return nil, cuda.Errorf("virtual.New", cuda.ErrInvalidArgument, "nil device")
	}
	return newResource(device{dev}, dev, opts)
}

// newResource is New over any driver (tests pass a fake).
func newResource(drv driver, dev *cuda.Device, opts *Options) (*Resource, error) {
	var o Options
	if opts != nil {
		o = *opts
		o.Peers = append([]*cuda.Device(nil), opts.Peers...)
	}
	prop, err := o.props(dev)
	if err != nil {
		return nil, err
	}
	f, err := drv.Features()
	if err != nil {
		return nil, err
	}
	if !f.VirtualMemory {
		return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "%v has no virtual memory management", dev)
	}
	if o.GPUDirectRDMA && !f.GPUDirectRDMAWithVMM {
		return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "GPUDirect RDMA is not supported with VMM on %v", dev)
	}
	if prop.RequestedHandleTypes&cuda.MemHandleTypePosixFileDescriptor != 0 && !f.PosixFDHandles {
		return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "%v cannot export VMM memory as POSIX file descriptors (use HandleNone)", dev)
	}
	if prop.RequestedHandleTypes&cuda.MemHandleTypeFabric != 0 {
		// The attribute says whether the device can; whether IMEX lets
		// this process shows at the first allocation (cuda.FabricError).
		ok, err := drv.FabricHandlesSupported()
		if err != nil {
			return nil, &cuda.OpError{Op: "virtual.New", Err: err}
		}
		if !ok {
			return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "option HandleType: %v reports no fabric handle support; %s", dev, cuda.FabricRequirements)
		}
	}
	for _, p := range o.Peers {
		ok, err := drv.peerCanAccess(p)
		if err != nil {
			return nil, &cuda.OpError{Op: "virtual.New", Err: fmt.Errorf("peer %v: %w", p, err)}
		}
		if !ok && o.Location == OnDevice {
			return nil, cuda.Errorf("virtual.New", cuda.ErrInvalidArgument, "option Peers: %v cannot access %v's memory", p, dev)
		}
	}
	kind := cuda.MemAllocationGranularityRecommended
	if o.Granularity == Minimum {
		kind = cuda.MemAllocationGranularityMinimum
	}
	gran, err := drv.AllocationGranularity(&prop, kind)
	if err != nil {
		return nil, err
	}
	// Everything below divides by the granularity and rounds to it.
	if gran == 0 || gran&(gran-1) != 0 {
		return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "the driver reports an allocation granularity of %d (not a power of two)", gran)
	}
	align, reserve, err := o.layout(gran)
	if err != nil {
		return nil, err
	}
	r := &Resource{dev: dev, drv: drv, opts: o, prop: prop, gran: gran, align: align, reserve: reserve,
		allocs: map[cuda.DevicePtr]*allocation{}}
	self, _ := o.SelfAccess.flags() // validated by props
	r.descs = append(r.descs, cuda.MemAccessDesc{Location: prop.Location, Flags: self})
	if o.Location != OnDevice {
		// Host memory is also made usable by the resource's own device.
		r.descs = append(r.descs, cuda.MemAccessDesc{Location: devLoc(dev), Flags: self})
	}
	peer, _ := o.PeerAccess.flags()
	for _, p := range o.Peers {
		r.descs = append(r.descs, cuda.MemAccessDesc{Location: devLoc(p), Flags: peer})
	}
	return r, nil
}

// check rejects nil and zero Resources (use New).
func (r *Resource) check(op string) error {
	if r == nil || r.dev == nil || r.drv == nil || r.gran == 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil or zero *virtual.Resource (create it with virtual.New)")
	}
	return nil
}

func devLoc(d *cuda.Device) cuda.MemLocation {
	return cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(ordinal(d))}
}

// ordinal is (*cuda.Device).Ordinal, as a variable so CPU tests can give
// device values made without a driver distinct ordinals (peers).
var ordinal = (*cuda.Device).Ordinal

// Granularity is the unit sizes are rounded up to (0 for a nil or zero
// Resource).
func (r *Resource) Granularity() uint64 {
	if r == nil {
		return 0
	}
	return r.gran
}

// Options returns a copy of the resource's options.
func (r *Resource) Options() Options {
	if r == nil {
		return Options{}
	}
	o := r.opts
	o.Peers = append([]*cuda.Device(nil), r.opts.Peers...)
	return o
}

// DeviceAccessible reports whether kernels on the device can use the memory.
func (r *Resource) DeviceAccessible() bool {
	return r.check("") == nil && r.opts.SelfAccess != NoAccess
}

// HostAccessible reports whether the memory is host memory.
func (r *Resource) HostAccessible() bool {
	return r.check("") == nil && r.opts.Location != OnDevice
}

// DeviceID is the device ordinal for device memory, -1 for host memory
// (and for a nil or zero Resource).
func (r *Resource) DeviceID() int {
	if r.check("") != nil || r.opts.Location != OnDevice {
		return -1
	}
	return ordinal(r.dev)
}

// Device is the resource's device (nil for a nil Resource).
func (r *Resource) Device() *cuda.Device {
	if r == nil {
		return nil
	}
	return r.dev
}

// String describes the resource for logs and errors.
func (r *Resource) String() string {
	if r == nil || r.dev == nil {
		return "virtual.Resource(nil)"
	}
	return fmt.Sprintf("virtual.Resource(%v, %d-byte chunks)", r.dev, r.gran)
}

// roundUp rounds size up to the granularity, refusing a size for which
// that overflows.
func (r *Resource) roundUp(op string, size uint64) (uint64, error) {
	up, ok := roundUp(size, r.gran)
	if !ok {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "size %d rounded up to the granularity %d overflows", size, r.gran)
	}
	return up, nil
}

func roundUp(n, gran uint64) (uint64, bool) {
	rem := n % gran
	if rem == 0 {
		return n, true
	}
	up := n + (gran - rem)
	return up, up > n
}

// Info describes one allocation's layout.
type Info struct {
	Size     uint64 // the buffer's size
	Mapped   uint64 // bytes of physical memory mapped
	Reserved uint64 // bytes of address space reserved
	Chunks   int    // physical allocations (cuMemCreate handles) held
}

// Info describes b's allocation. A buffer closed meanwhile (by Close, or
// consumed by Grow or Shrink) gives an error matching cuda.ErrClosed.
func (r *Resource) Info(b *buffer.Buffer) (Info, error) {
	var info Info
	err := r.withLive("Resource.Info", b, func(a *allocation) error {
		info = Info{Size: a.size, Mapped: a.mapped, Reserved: a.resv, Chunks: len(a.chunks)}
		return nil
	})
	return info, err
}

// Live returns the base addresses of the resource's live allocations.
func (r *Resource) Live() []cuda.DevicePtr {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.allocs))
}
