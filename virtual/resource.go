package virtual

import (
	"errors"
	"fmt"
	"sort"
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
	align   uint64
	reserve uint64 // Options.Reserve rounded up to the granularity
	descs   []cuda.MemAccessDesc
	// reserveAlign is the alignment new ranges are reserved with: the
	// granularity, or AddrAlign where that asks for more.
	reserveAlign uint64

	mu     sync.Mutex
	allocs map[cuda.DevicePtr]*allocation

	left pending // what failed cleanups could not give back yet
}

// allocation is one live VMM allocation: physical chunks mapped back to back
// from base, inside address reservations that are contiguous from base.
//
// Invariants, between operations: the chunks cover [0, mapped) in order;
// mapped >= size rounded up to the granularity; mapped <= the reserved
// total. An operation that fails restores them before it returns, or takes
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
}

type span struct {
	ptr  cuda.DevicePtr
	size uint64
}

type chunk struct {
	off, size uint64
	h         cuda.MemHandle
}

func (a *allocation) reserved() uint64 { return a.resv }

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
	r.reserveAlign = max(align, gran)
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

// roundUp rounds n up to the granularity; false if that overflows.
func (r *Resource) roundUp(n uint64) (uint64, bool) {
	return roundUp(n, r.gran)
}

func roundUp(n, gran uint64) (uint64, bool) {
	rem := n % gran
	if rem == 0 {
		return n, true
	}
	up := n + (gran - rem)
	return up, up > n
}

// undo runs cleanup steps in reverse unless disarmed: a failed operation
// leaves nothing behind. (Import uses it; the resource's own operations
// use txn, which also reports and keeps what fails to clean up.)
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }
func (u *undo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}

// newChunk creates size bytes of physical memory and maps it at ptr with
// the given access, recording each step in t for a rollback.
func (r *Resource) newChunk(t *txn, ptr cuda.DevicePtr, size uint64, descs []cuda.MemAccessDesc) (cuda.MemHandle, error) {
	h, err := r.drv.MemCreate(size, &r.prop)
	if err != nil {
		return 0, err
	}
	t.created(h)
	if err := r.drv.MemMap(ptr, size, 0, h); err != nil {
		return 0, err
	}
	t.mapped(ptr, size)
	if err := r.drv.MemSetAccess(ptr, size, descs...); err != nil {
		return 0, err
	}
	return h, nil
}

// reserveRange reserves size bytes of address space for a new range (an
// allocation, an import, or the range a moving Grow builds) and records it
// in t.
//
// It passes the granularity as the alignment (or AddrAlign, where that is
// more), as the C baseline does: every mapping must start on a granule.
// (Alignment 0, the driver's default, made the 1 GiB allocate+close cycle
// about twice as slow as C's with the granularity passed; see
// BENCHMARKS.md.) A range the driver put off the alignment anyway is
// given back (kept as a leftover if that fails) and the reservation fails.
func (r *Resource) reserveRange(t *txn, size uint64, hint cuda.DevicePtr) (cuda.DevicePtr, error) {
	p, err := r.drv.MemAddressReserve(size, r.reserveAlign, hint)
	if err != nil {
		return 0, err
	}
	if uint64(p)%r.reserveAlign != 0 {
		err := cuda.Errorf("cuMemAddressReserve", cuda.ErrorUnknown, "the driver reserved %d bytes at %#x, off the alignment %d it was asked for", size, uint64(p), r.reserveAlign)
		if ferr := r.drv.MemAddressFree(p, size); ferr != nil {
			r.left.keep(&leftovers{spans: []span{{p, size}}})
			err = errors.Join(err, fmt.Errorf("giving the range back: %w (kept for a retry)", ferr))
		}
		return 0, err
	}
	t.reserved(p, size)
	return p, nil
}

// retryLeftovers gives back what earlier failed cleanups could not. It is
// best effort by design: whatever fails again stays recorded for the next
// operation, and Reclaim reports it, so an unrelated operation is not
// failed by an old leftover.
func (r *Resource) retryLeftovers() {
	_ = r.left.retry(r.drv)
}

// Reclaim retries giving back the driver resources (mappings, physical
// memory, address ranges) that the cleanup of an earlier failed operation
// could not give back, and reports what still fails. Every operation
// retries them by itself; Reclaim is for callers (and tests) that want to
// know. It returns nil when nothing is pending.
func (r *Resource) Reclaim() error {
	if err := r.check("Resource.Reclaim"); err != nil {
		return err
	}
	if err := r.left.retry(r.drv); err != nil {
		return &cuda.OpError{Op: "Resource.Reclaim", Err: err}
	}
	return nil
}

// Allocate maps size bytes (rounded up to the granularity; the Buffer has
// exactly size bytes). The stream only becomes the buffer's stream: mapping
// is synchronous. Size 0 returns an empty buffer. On error nothing is left
// allocated.
func (r *Resource) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]):
// the base address (0 for size 0) and s, the stream Close frees on.
func (r *Resource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	const op = "Resource.Allocate"
	if err := r.check(op); err != nil {
		return 0, nil, err
	}
	// Mapping is synchronous, not stream-ordered: captured, it would be
	// done once now rather than at each launch of the graph.
	if err := s.RefuseCapture(op); err != nil {
		return 0, nil, err
	}
	if size == 0 {
		return 0, s, nil
	}
	aligned, ok := r.roundUp(size)
	if !ok {
		return 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "size %d rounded up to the granularity %d overflows", size, r.gran)
	}
	reserve := max(aligned, r.reserve)
	if hint := uint64(r.opts.AddrHint); hint != 0 && hint+reserve < hint {
		return 0, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "address hint %#x plus %d bytes overflows", hint, reserve)
	}
	r.retryLeftovers()
	var t txn
	t.start()
	ptr, err := r.reserveRange(&t, reserve, r.opts.AddrHint)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %d bytes: %w", op, size, err)
	}
	// Chunks share the resource's access list; setDesc copies before it
	// changes one allocation's.
	descs := r.descs
	h, err := r.newChunk(&t, ptr, aligned, descs)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %d bytes: %w", op, size, r.rollback(&t, err))
	}
	a := &allocation{base: ptr, size: size, mapped: aligned, reservations: []span{{ptr, reserve}}, resv: reserve,
		chunks: []chunk{{off: 0, size: aligned, h: h}}, descs: descs}
	r.mu.Lock()
	r.allocs[ptr] = a
	r.mu.Unlock()
	return ptr, s, nil
}

// Deallocate waits for s (nil: the legacy default stream), then unmaps the
// allocation, releases every physical chunk and frees its address space.
// It waits for that one stream, not for the whole device: work the caller
// submitted on other streams is the caller's to order before the free.
//
// If that fails before anything was given back, the allocation is left as
// it was: the buffer stays open and usable, and Close can be retried. Once
// a chunk is unmapped there is no way back (mapping it again can fail
// too, and a buffer must never stay open over unmapped memory: on a real
// GPU a stray access poisons the context). So from there on Deallocate
// always finishes: the allocation is removed, whatever the driver refuses
// to give back is kept as the resource's leftovers (retried by later
// operations and by Reclaim, never released twice), and the error wraps
// buffer.ErrPartlyFreed, which makes the buffer close anyway.
func (r *Resource) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "Resource.Deallocate"
	if err := r.check(op); err != nil {
		return err
	}
	if ptr == 0 {
		return nil
	}
	// The free waits for s, which a capture forbids: refuse it before
	// anything changes, so the buffer stays open and the capture valid.
	if err := s.RefuseCapture(op); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays allocated)", err, uint64(ptr), size)
	}
	r.mu.Lock()
	a := r.allocs[ptr]
	if a != nil && a.size != size {
		// A free of the wrong size is a caller's mistake about what ptr
		// is: refuse it, leaving the allocation (and its buffer) intact.
		r.mu.Unlock()
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x is an allocation of %d bytes, not %d", uint64(ptr), a.size, size)
	}
	delete(r.allocs, ptr)
	r.mu.Unlock()
	if a == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) is not an allocation of this resource", uint64(ptr), size)
	}
	err := r.wait(op, s)
	freed := false
	if err == nil {
		freed, err = r.free(a)
	}
	if err == nil {
		return nil
	}
	if freed {
		return fmt.Errorf("%s %#x: %w (what was not given back is kept for a retry; see Reclaim): %w", op, uint64(ptr), buffer.ErrPartlyFreed, err)
	}
	// Nothing was given back: file it again, so the buffer stays usable
	// and Close can be retried.
	r.mu.Lock()
	r.allocs[ptr] = a
	r.mu.Unlock()
	return fmt.Errorf("%s %#x (nothing freed; the buffer is intact): %w", op, uint64(ptr), err)
}

// wait lets the work submitted to s (nil: the legacy default stream) finish
// before memory it may use is unmapped. It waits for that stream only,
// never for the whole device: work on other streams is the caller's to
// order, as for any free.
func (r *Resource) wait(op string, s *cuda.Stream) error {
	s, err := r.dev.ResolveStream(op, s, false)
	if err != nil {
		return err
	}
	return r.drv.syncStream(s)
}

// mapChunk maps c at base+c.off with the access descs. If the access
// cannot be set it unmaps c again, so c ends either fully mapped or not
// mapped at all; a mapping that will not go is kept as a leftover.
func (r *Resource) mapChunk(base cuda.DevicePtr, c chunk, descs []cuda.MemAccessDesc) error {
	at := base + cuda.DevicePtr(c.off)
	if err := r.drv.MemMap(at, c.size, 0, c.h); err != nil {
		return err
	}
	if err := r.drv.MemSetAccess(at, c.size, descs...); err != nil {
		if uerr := r.drv.MemUnmap(at, c.size); uerr != nil {
			r.left.keep(&leftovers{maps: []span{{at, c.size}}})
			return errors.Join(err, fmt.Errorf("unmapping it again: %w (kept for a retry)", uerr))
		}
		return err
	}
	return nil
}

// unmapFrom unmaps a.chunks[i:], the last first, and returns i. If an
// unmap fails, the chunks this call already unmapped are mapped again,
// lowest first, so a is exactly as it was: it then returns len(a.chunks)
// and the error. Only if that also fails does it return some k in
// [i, len(a.chunks)) with the error: a.chunks[:k] are mapped and
// a.chunks[k:] are not (what is mapped is always a prefix).
func (r *Resource) unmapFrom(a *allocation, i int) (int, error) {
	for j := len(a.chunks) - 1; j >= i; j-- {
		c := a.chunks[j]
		err := r.drv.MemUnmap(a.base+cuda.DevicePtr(c.off), c.size)
		if err == nil {
			continue
		}
		err = fmt.Errorf("unmapping the chunk at offset %d: %w", c.off, err)
		for k := j + 1; k < len(a.chunks); k++ {
			if rerr := r.mapChunk(a.base, a.chunks[k], a.descs); rerr != nil {
				return k, errors.Join(err, fmt.Errorf("mapping the chunk at offset %d again: %w", a.chunks[k].off, rerr))
			}
		}
		return len(a.chunks), err
	}
	return i, nil
}

// free unmaps and releases everything a holds. If the first unmap fails
// (and the chunks unmapped before it are mapped again), nothing changed:
// it returns freed == false and a is whole. Otherwise a is past the point
// of no return and freed is true: every step is tried, and whatever the
// driver refuses (mappings, handles, address ranges) moves to r.left, so
// a itself holds nothing any more and nothing is released twice.
func (r *Resource) free(a *allocation) (freed bool, err error) {
	r.retryLeftovers() // they may sit in a's address space
	k, err := r.unmapFrom(a, 0)
	if err != nil && k == len(a.chunks) {
		return false, err // nothing changed: a is still whole and usable
	}
	// a.chunks[:k] are still mapped (k is 0 unless mapping back failed
	// after a failed unmap); the rest are unmapped. reap unmaps, then
	// releases every handle, then frees the address space once nothing
	// is mapped in it, keeping what fails.
	var l leftovers
	for _, c := range a.chunks[:k] {
		l.maps = append(l.maps, span{a.base + cuda.DevicePtr(c.off), c.size})
	}
	for _, c := range a.chunks {
		l.handles = append(l.handles, c.h)
	}
	l.spans = append(l.spans, a.reservations...)
	a.chunks, a.mapped = nil, 0
	a.setReservations(nil)
	rerr := reap(r.drv, &l)
	r.left.keep(&l)
	return true, errors.Join(err, rerr)
}

// take finds b's allocation and hands b's ownership to the caller: b must
// be a live, owned buffer from this resource.
func (r *Resource) take(op string, b *buffer.Buffer) (*allocation, *cuda.Stream, error) {
	if err := r.check(op); err != nil {
		return nil, nil, err
	}
	if b == nil {
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil buffer")
	}
	if b.Resource() != buffer.MemoryResource(r) {
		if b.IsClosed() {
			return nil, nil, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		}
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v does not belong to this resource", b)
	}
	ptr := b.Ptr()
	r.mu.Lock()
	a := r.allocs[ptr]
	r.mu.Unlock()
	if a == nil || !b.IsOwned() {
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is not a whole allocation of this resource", b)
	}
	return a, b.Stream(), nil
}

// refuseHeld refuses to move or unmap b's memory while a Hold (a DLPack
// export, say) lends it out: checked before any driver call, since the
// Buffer could not be rewrapped afterwards and the holder would be left
// with memory unmapped under it.
func refuseHeld(op string, b *buffer.Buffer) error {
	if n := b.Holds(); n > 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is held by %d Hold(s) (a DLPack export, say): release them before it is moved or unmapped", b, n)
	}
	return nil
}

// live reports, under r.mu, whether a is still filed under ptr and usable.
func (r *Resource) live(op string, ptr cuda.DevicePtr, a *allocation) error {
	if r.allocs[ptr] != a {
		return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	return nil
}

// Grow returns a buffer of newSize bytes holding b's data, and closes b
// (without freeing). The pointer stays the same unless the address space
// after the allocation is taken; no data is copied either way. When the
// allocation must move, Grow first waits for b's stream (nil: the legacy
// default stream), so work already submitted on it is done before the old
// addresses are unmapped; work on other streams is the caller's to order,
// as for Close. A newSize not above b's size returns b unchanged. Grow
// consumes b: do not use b concurrently with it.
//
// On error with a nil buffer, the grow did not happen and b is untouched
// (anything its undoing could not give back is kept for a retry, see
// Reclaim). A non-nil buffer with an error means the grow took effect: b
// is consumed and the returned buffer is the one to use and close, but
// some address space or mappings no longer needed (the old range after a
// move, or a range the driver granted at the wrong address) could not be
// given back. They are kept and retried by later operations and by
// Reclaim, and the error wraps buffer.ErrPartlyFreed, so
// errors.Is(err, buffer.ErrPartlyFreed) tells this case apart.
func (r *Resource) Grow(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	const op = "Resource.Grow"
	a, s, err := r.take(op, b)
	if err == nil {
		err = refuseHeld(op, b)
	}
	if err != nil {
		return nil, err
	}
	if newSize <= b.Size() {
		return b, nil
	}
	need, ok := r.roundUp(newSize)
	if !ok {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "size %d rounded up to the granularity %d overflows", newSize, r.gran)
	}
	r.retryLeftovers()
	oldPtr := b.Ptr() // before r.mu: Buffer locks are never taken under r.mu
	r.mu.Lock()
	if err := r.live(op, oldPtr, a); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	var cleanup error
	if need > a.mapped {
		if cleanup, err = r.extend(a, need, s); err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("%s %#x from %d to %d bytes: %w", op, uint64(oldPtr), b.Size(), newSize, err)
		}
	}
	r.rekey(oldPtr, a)
	a.size = newSize
	base := a.base
	r.mu.Unlock()
	nb, err := r.rewrap(b, base, newSize, s)
	if err != nil {
		return nil, errors.Join(err, cleanup)
	}
	if cleanup != nil {
		return nb, fmt.Errorf("%s %#x to %d bytes (done, now at %#x): %w: %w", op, uint64(oldPtr), newSize, uint64(base), buffer.ErrPartlyFreed, cleanup)
	}
	return nb, nil
}

// rekey files a under its (possibly new) base. Called with r.mu held.
//
// Lock order: a Buffer's lock, then r.mu (Close holds the first while
// Deallocate takes the second). So nothing here calls a Buffer method
// (Ptr, String, Disown...) while holding r.mu.
func (r *Resource) rekey(oldPtr cuda.DevicePtr, a *allocation) {
	if a.base != oldPtr {
		delete(r.allocs, oldPtr)
		r.allocs[a.base] = a
	}
}

// rewrap moves ownership from b to a new buffer at base. It must not be
// called with r.mu held (it takes b's lock, and Close holds b's lock while
// it takes r.mu).
func (r *Resource) rewrap(b *buffer.Buffer, base cuda.DevicePtr, size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	if _, _, err := b.Disown(); err != nil {
		return nil, err
	}
	return buffer.Owned(base, size, r, s), nil
}

// extend maps memory so a covers need bytes. Called with r.mu held. On
// error a is as it was; cleanup reports leftovers of a completed move.
func (r *Resource) extend(a *allocation, need uint64, s *cuda.Stream) (cleanup, err error) {
	add := need - a.mapped
	reserved := a.reserved()
	var t txn
	t.start()
	var grown *span
	if need > reserved {
		// Ask for the address space right after ours.
		extra := need - reserved
		hint := a.base + cuda.DevicePtr(reserved)
		if uint64(hint)+extra < uint64(hint) {
			return r.remap(a, need, s) // no room before the top of the address space
		}
		p, err := r.drv.MemAddressReserve(extra, r.gran, hint)
		if err != nil {
			// Not granted: moving is the designed fallback, and its own
			// failure is what the caller hears about.
			return r.remap(a, need, s)
		}
		if p != hint {
			// Granted elsewhere: of no use, so give it back and move. A
			// failure to free it is kept for a retry and reported with
			// the outcome of the move (as cleanup if the move succeeds).
			var stray error
			if ferr := r.drv.MemAddressFree(p, extra); ferr != nil {
				r.left.keep(&leftovers{spans: []span{{p, extra}}})
				stray = fmt.Errorf("freeing the %d bytes of address space granted at %#x instead of %#x: %w (kept for a retry)", extra, uint64(p), uint64(hint), ferr)
			}
			cleanup, err := r.remap(a, need, s)
			if err != nil {
				return nil, errors.Join(err, stray)
			}
			return errors.Join(cleanup, stray), nil
		}
		t.reserved(p, extra)
		grown = &span{p, extra}
	}
	h, err := r.newChunk(&t, a.base+cuda.DevicePtr(a.mapped), add, a.descs)
	if err != nil {
		return nil, r.rollback(&t, err)
	}
	if grown != nil {
		a.reservations = append(a.reservations, *grown)
		a.resv += grown.size
	}
	a.chunks = append(a.chunks, chunk{off: a.mapped, size: add, h: h})
	a.mapped = need
	return nil, nil
}

// remap builds the allocation again in a new range of need bytes: the old
// chunks are mapped there too (the same physical memory: nothing is
// copied), a new chunk fills the rest, access is set on the whole new
// range at once, then the old range is unmapped (in one call: its
// mappings are contiguous) and given back. So a move costs one map per
// chunk plus a constant, no more than remapping the chunks.
// If anything fails before the move, the old allocation is left as it was.
// Failures to give back the old range come after the move: they are kept
// for a retry and reported as cleanup.
func (r *Resource) remap(a *allocation, need uint64, s *cuda.Stream) (cleanup, err error) {
	reserve := max(need, r.reserve)
	var t txn
	t.start()
	np, err := r.reserveRange(&t, reserve, 0)
	if err != nil {
		return nil, r.rollback(&t, err)
	}
	for _, c := range a.chunks {
		at := np + cuda.DevicePtr(c.off)
		if err := r.drv.MemMap(at, c.size, 0, c.h); err != nil {
			return nil, r.rollback(&t, err)
		}
		t.mapped(at, c.size)
	}
	h, err := r.drv.MemCreate(need-a.mapped, &r.prop)
	if err != nil {
		return nil, r.rollback(&t, err)
	}
	t.created(h)
	at := np + cuda.DevicePtr(a.mapped)
	if err := r.drv.MemMap(at, need-a.mapped, 0, h); err != nil {
		return nil, r.rollback(&t, err)
	}
	t.mapped(at, need-a.mapped)
	if err := r.drv.MemSetAccess(np, need, a.descs...); err != nil {
		return nil, r.rollback(&t, err)
	}
	// The new range is complete. Work already submitted may still use the
	// old addresses: let it finish before they go.
	if err := r.wait("Resource.Grow", s); err != nil {
		return nil, r.rollback(&t, err)
	}
	oldBase, oldMapped, oldResv := a.base, a.mapped, a.reservations
	a.base = np
	a.setReservations([]span{{np, reserve}})
	a.chunks = append(a.chunks, chunk{off: a.mapped, size: need - a.mapped, h: h})
	a.mapped = need
	// The handles now belong to the new range; the old range holds only
	// its mappings (chunks back to back from oldBase) and address space.
	old := leftovers{maps: []span{{oldBase, oldMapped}}, spans: oldResv}
	if rerr := reap(r.drv, &old); rerr != nil {
		cleanup = fmt.Errorf("giving back the old range at %#x: %w (kept for a retry)", uint64(oldBase), rerr)
	}
	r.left.keep(&old)
	return cleanup, nil
}

// Shrink returns a buffer of newSize bytes holding the start of b's data,
// and closes b (without freeing). Whole chunks past the new size are
// unmapped and released; the address space stays reserved, so a later
// Grow back is in place. A newSize not below b's size returns b unchanged.
// Before unmapping anything it waits for b's stream (nil: the legacy
// default stream); a shrink that stays within the last chunk unmaps
// nothing and waits for nothing.
//
// On error with a nil buffer, the shrink did not happen and b is
// untouched. A non-nil buffer with an error means the shrink took effect
// (b is consumed and the returned buffer is the one to use and close:
// nothing addresses the unmapped tail) but some chunks could not be given
// back: they stay mapped in the allocation (Info counts them; Close frees
// them) or are kept and retried by later operations and by Reclaim. That
// error wraps buffer.ErrPartlyFreed, so errors.Is tells the two apart.
func (r *Resource) Shrink(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	const op = "Resource.Shrink"
	a, s, err := r.take(op, b)
	if err == nil {
		err = refuseHeld(op, b)
	}
	if err != nil {
		return nil, err
	}
	if newSize >= b.Size() {
		return b, nil
	}
	if newSize == 0 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "new size 0 for buffer %v: close the buffer instead", b)
	}
	r.retryLeftovers()
	oldPtr := b.Ptr()
	oldSize := b.Size()
	need, _ := r.roundUp(newSize) // below b's size, which was rounded up once already
	// Keep the chunks that start below need: chunk 0 always (need > 0).
	// If that unmaps any, wait for b's stream first (outside r.mu); a
	// shrink within the last chunk unmaps nothing and waits for nothing.
	var i int
	for waited := false; ; waited = true {
		r.mu.Lock()
		if err := r.live(op, oldPtr, a); err != nil {
			r.mu.Unlock()
			return nil, err
		}
		i = sort.Search(len(a.chunks), func(i int) bool { return a.chunks[i].off >= need })
		if i == len(a.chunks) || waited {
			break // holding r.mu
		}
		r.mu.Unlock()
		if err := r.wait(op, s); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	k, err := r.unmapFrom(a, i)
	if err != nil && k == len(a.chunks) {
		r.mu.Unlock()
		return nil, fmt.Errorf("%s %#x from %d to %d bytes: %w", op, uint64(oldPtr), oldSize, newSize, err)
	}
	// Taking effect: a.chunks[k:] are unmapped (k >= i, so everything below
	// need is still mapped). The size shrinks with them, so nothing can
	// address the unmapped range.
	var gone leftovers
	for _, c := range a.chunks[k:] {
		gone.handles = append(gone.handles, c.h)
	}
	if k < len(a.chunks) {
		a.mapped = a.chunks[k].off
	}
	a.chunks = a.chunks[:k]
	a.size = newSize
	if rerr := reap(r.drv, &gone); rerr != nil {
		err = errors.Join(err, rerr)
	}
	r.left.keep(&gone)
	base, mapped := a.base, a.mapped
	r.mu.Unlock()
	nb, derr := r.rewrap(b, base, newSize, s)
	if derr != nil {
		return nil, errors.Join(derr, err)
	}
	if err != nil {
		return nb, fmt.Errorf("%s %#x from %d to %d bytes (done; %d bytes still mapped): %w: %w", op, uint64(oldPtr), oldSize, newSize, mapped, buffer.ErrPartlyFreed, err)
	}
	return nb, nil
}

// SetPeerAccess sets the given devices' access to b's memory (NoAccess
// revokes it). The setting also applies to memory a later Grow adds. On
// error the previous access is put back.
func (r *Resource) SetPeerAccess(b *buffer.Buffer, access Access, peers ...*cuda.Device) error {
	const op = "Resource.SetPeerAccess"
	a, _, err := r.take(op, b)
	if err != nil {
		return err
	}
	f, err := access.flags()
	if err != nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v", err)
	}
	if err := checkPeers(op, "peer", r.dev, peers); err != nil {
		return err
	}
	descs := make([]cuda.MemAccessDesc, 0, len(peers))
	for _, p := range peers {
		if f != cuda.MemAccessProtNone {
			ok, err := r.drv.peerCanAccess(p)
			if err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			if !ok && r.opts.Location == OnDevice {
				return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v cannot access %v's memory", p, r.dev)
			}
		}
		descs = append(descs, cuda.MemAccessDesc{Location: devLoc(p), Flags: f})
	}
	if len(descs) == 0 {
		return nil
	}
	ptr := b.Ptr()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.live(op, ptr, a); err != nil {
		return err
	}
	if err := r.drv.MemSetAccess(a.base, a.mapped, descs...); err != nil {
		err = fmt.Errorf("%s %#x: %w", op, uint64(a.base), err)
		// The driver may have changed part of the range: put the recorded
		// access back, so the allocation is as it was.
		prev := make([]cuda.MemAccessDesc, len(descs))
		for i, d := range descs {
			prev[i] = cuda.MemAccessDesc{Location: d.Location, Flags: a.flagsFor(d.Location)}
		}
		if rerr := r.drv.MemSetAccess(a.base, a.mapped, prev...); rerr != nil {
			err = errors.Join(err, fmt.Errorf("putting the previous access back: %w", rerr))
		}
		return err
	}
	for _, d := range descs {
		a.setDesc(d)
	}
	return nil
}

// flagsFor is the access recorded for loc (none if never granted).
func (a *allocation) flagsFor(loc cuda.MemLocation) cuda.MemAccessFlags {
	for _, d := range a.descs {
		if d.Location == loc {
			return d.Flags
		}
	}
	return cuda.MemAccessProtNone
}

// setDesc records d, replacing any earlier entry for its location.
func (a *allocation) setDesc(d cuda.MemAccessDesc) {
	descs := append([]cuda.MemAccessDesc(nil), a.descs...) // chunks may share the old slice
	for i := range descs {
		if descs[i].Location == d.Location {
			descs[i] = d
			a.descs = descs
			return
		}
	}
	a.descs = append(descs, d)
}

// Access reports how dev may access b's memory.
func (r *Resource) Access(b *buffer.Buffer, dev *cuda.Device) (Access, error) {
	const op = "Resource.Access"
	a, _, err := r.take(op, b)
	if err != nil {
		return NoAccess, err
	}
	if dev == nil {
		return NoAccess, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device")
	}
	ptr := b.Ptr()
	r.mu.Lock()
	defer r.mu.Unlock() // a.base changes when a grow moves it
	if err := r.live(op, ptr, a); err != nil {
		return NoAccess, err
	}
	f, err := r.drv.MemGetAccess(a.base, devLoc(dev))
	if err != nil {
		return NoAccess, fmt.Errorf("%s: %w", op, err)
	}
	switch f {
	case cuda.MemAccessProtReadWrite:
		return ReadWrite, nil
	case cuda.MemAccessProtRead:
		return ReadOnly, nil
	}
	return NoAccess, nil
}

// Info describes one allocation's layout.
type Info struct {
	Size     uint64 // the buffer's size
	Mapped   uint64 // bytes of physical memory mapped
	Reserved uint64 // bytes of address space reserved
	Chunks   int    // physical allocations (cuMemCreate handles) held
}

// Info describes b's allocation.
func (r *Resource) Info(b *buffer.Buffer) (Info, error) {
	a, _, err := r.take("Resource.Info", b)
	if err != nil {
		return Info{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return Info{Size: a.size, Mapped: a.mapped, Reserved: a.reserved(), Chunks: len(a.chunks)}, nil
}

// Live returns the base addresses of the resource's live allocations.
func (r *Resource) Live() []cuda.DevicePtr {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]cuda.DevicePtr, 0, len(r.allocs))
	for p := range r.allocs {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
