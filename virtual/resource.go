package virtual

import (
	"fmt"
	"sort"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// Resource allocates VMM memory; see the package documentation. It is a
// buffer.MemoryResource and is safe for concurrent use.
type Resource struct {
	dev   *cuda.Device
	opts  Options
	prop  cuda.MemAllocationProp
	gran  uint64
	align uint64
	descs []cuda.MemAccessDesc

	mu     sync.Mutex
	allocs map[cuda.DevicePtr]*allocation
}

// allocation is one live VMM allocation: physical chunks mapped back to back
// from base, inside address reservations that are contiguous from base.
type allocation struct {
	base         cuda.DevicePtr
	size         uint64 // the size the user asked for
	mapped       uint64 // bytes mapped from base (a multiple of gran)
	reservations []span
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
	unmapped  bool // set when a failed free got as far as unmapping it
}

func (a *allocation) reserved() uint64 {
	var n uint64
	for _, r := range a.reservations {
		n += r.size
	}
	return n
}

// New creates a VMM resource on dev (which also serves host-located
// memory). Invalid options are rejected with an error naming the option;
// missing device support returns an error matching cuda.ErrNotSupported.
func New(dev *cuda.Device, opts *Options) (*Resource, error) {
	if dev == nil {
		return nil, cuda.Errorf("virtual.New", cuda.ErrInvalidArgument, "nil device")
	}
	var o Options
	if opts != nil {
		o = *opts
		o.Peers = append([]*cuda.Device(nil), opts.Peers...)
	}
	prop, err := o.props(dev)
	if err != nil {
		return nil, err
	}
	f, err := dev.Features()
	if err != nil {
		return nil, err
	}
	if !f.VirtualMemory {
		return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "%v has no virtual memory management", dev)
	}
	if o.GPUDirectRDMA && !f.GPUDirectRDMAWithVMM {
		return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "GPUDirect RDMA is not supported with VMM on %v", dev)
	}
	if prop.RequestedHandleTypes == cuda.MemHandleTypePosixFileDescriptor && !f.PosixFDHandles {
		return nil, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "%v cannot export VMM memory as POSIX file descriptors (use HandleNone)", dev)
	}
	for _, p := range o.Peers {
		ok, err := p.CanAccessPeer(dev)
		if err != nil {
			return nil, err
		}
		if !ok && o.Location == OnDevice {
			return nil, cuda.Errorf("virtual.New", cuda.ErrInvalidArgument, "option Peers: %v cannot access %v's memory", p, dev)
		}
	}
	kind := cuda.MemAllocationGranularityRecommended
	if o.Granularity == Minimum {
		kind = cuda.MemAllocationGranularityMinimum
	}
	gran, err := dev.AllocationGranularity(&prop, kind)
	if err != nil {
		return nil, err
	}
	r := &Resource{dev: dev, opts: o, prop: prop, gran: gran, align: gran, allocs: map[cuda.DevicePtr]*allocation{}}
	if o.AddrAlign > gran {
		r.align = o.AddrAlign
	}
	self, _ := o.SelfAccess.flags()
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
	if r == nil || r.dev == nil || r.gran == 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil or zero *virtual.Resource (create it with virtual.New)")
	}
	return nil
}

func devLoc(d *cuda.Device) cuda.MemLocation {
	return cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())}
}

// Granularity is the unit sizes are rounded up to.
func (r *Resource) Granularity() uint64 { return r.gran }

// Options returns a copy of the resource's options.
func (r *Resource) Options() Options {
	o := r.opts
	o.Peers = append([]*cuda.Device(nil), r.opts.Peers...)
	return o
}

// DeviceAccessible reports whether kernels on the device can use the memory.
func (r *Resource) DeviceAccessible() bool { return r.opts.SelfAccess != NoAccess }

// HostAccessible reports whether the memory is host memory.
func (r *Resource) HostAccessible() bool { return r.opts.Location != OnDevice }

// DeviceID is the device ordinal for device memory, -1 for host memory.
func (r *Resource) DeviceID() int {
	if r == nil || r.dev == nil || r.opts.Location != OnDevice {
		return -1
	}
	return r.dev.Ordinal()
}

// Device is the resource's device.
func (r *Resource) Device() *cuda.Device { return r.dev }

func (r *Resource) alignUp(n uint64) uint64 {
	if n == 0 {
		return 0
	}
	return (n + r.gran - 1) / r.gran * r.gran
}

// undo runs cleanup steps in reverse unless disarmed: a failed operation
// leaves nothing behind.
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }
func (u *undo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}

// newChunk creates size bytes of physical memory and maps it at ptr with
// the resource's access, recording undo steps.
func (r *Resource) newChunk(ptr cuda.DevicePtr, size uint64, descs []cuda.MemAccessDesc, u *undo) (cuda.MemHandle, error) {
	h, err := r.dev.MemCreate(size, &r.prop)
	if err != nil {
		return 0, err
	}
	u.add(func() { r.dev.MemRelease(h) })
	if err := r.dev.MemMap(ptr, size, 0, h); err != nil {
		return 0, err
	}
	u.add(func() { r.dev.MemUnmap(ptr, size) })
	if err := r.dev.MemSetAccess(ptr, size, descs...); err != nil {
		return 0, err
	}
	return h, nil
}

// Allocate maps size bytes (rounded up to the granularity; the Buffer has
// exactly size bytes). The stream only becomes the buffer's stream: mapping
// is synchronous. Size 0 returns an empty buffer.
func (r *Resource) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	if err := r.check("virtual.Allocate"); err != nil {
		return nil, err
	}
	if size == 0 {
		return buffer.Owned(0, 0, r, s), nil
	}
	aligned := r.alignUp(size)
	if aligned < size {
		return nil, cuda.Errorf("virtual.Allocate", cuda.ErrInvalidArgument, "size %d overflows", size)
	}
	reserve := max(aligned, r.alignUp(r.opts.Reserve))
	var u undo
	ptr, err := r.dev.MemAddressReserve(reserve, r.align, r.opts.AddrHint)
	if err != nil {
		return nil, fmt.Errorf("virtual.Allocate %d bytes: %w", size, err)
	}
	u.add(func() { r.dev.MemAddressFree(ptr, reserve) })
	descs := append([]cuda.MemAccessDesc(nil), r.descs...)
	h, err := r.newChunk(ptr, aligned, descs, &u)
	if err != nil {
		u.run()
		return nil, fmt.Errorf("virtual.Allocate %d bytes: %w", size, err)
	}
	a := &allocation{base: ptr, size: size, mapped: aligned,
		reservations: []span{{ptr, reserve}}, chunks: []chunk{{off: 0, size: aligned, h: h}}, descs: descs}
	r.mu.Lock()
	r.allocs[ptr] = a
	r.mu.Unlock()
	return buffer.Owned(ptr, size, r, s), nil
}

// Deallocate waits for s (or, if nil, the device), then unmaps the
// allocation, releases every physical chunk and frees its address space.
func (r *Resource) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if err := r.check("virtual.Deallocate"); err != nil {
		return err
	}
	r.mu.Lock()
	a := r.allocs[ptr]
	delete(r.allocs, ptr)
	r.mu.Unlock()
	if a == nil {
		return cuda.Errorf("virtual.Deallocate", cuda.ErrInvalidArgument, "%#x (%d bytes) is not an allocation of this resource", uint64(ptr), size)
	}
	err := r.wait(s)
	if err == nil {
		err = r.free(a)
	}
	if err != nil {
		// Keep it findable: the buffer stays open and Close can be retried.
		r.mu.Lock()
		r.allocs[ptr] = a
		r.mu.Unlock()
	}
	return err
}

func (r *Resource) wait(s *cuda.Stream) error {
	if s != nil {
		return s.Sync()
	}
	return r.dev.Sync()
}

// free unmaps and releases everything a holds, reporting the first error.
// What succeeded is removed from a, so a retry (Close again) continues
// where a failure stopped instead of releasing anything twice.
func (r *Resource) free(a *allocation) error {
	var first error
	keep := func(err error) bool {
		if err != nil && first == nil {
			first = fmt.Errorf("virtual: freeing %#x: %w", uint64(a.base), err)
		}
		return err != nil
	}
	left := a.chunks[:0]
	for _, c := range a.chunks {
		if !c.unmapped {
			if keep(r.dev.MemUnmap(a.base+cuda.DevicePtr(c.off), c.size)) {
				left = append(left, c)
				continue
			}
			c.unmapped = true
		}
		if keep(r.dev.MemRelease(c.h)) {
			left = append(left, c)
		}
	}
	a.chunks = left
	if len(a.chunks) > 0 {
		return first // address space goes only once nothing is mapped in it
	}
	resv := a.reservations[:0]
	for _, s := range a.reservations {
		if keep(r.dev.MemAddressFree(s.ptr, s.size)) {
			resv = append(resv, s)
		}
	}
	a.reservations = resv
	return first
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
	r.mu.Lock()
	a := r.allocs[b.Ptr()]
	r.mu.Unlock()
	if a == nil || !b.IsOwned() {
		return nil, nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer %v is not a whole allocation of this resource", b)
	}
	return a, b.Stream(), nil
}

// Grow returns a buffer of newSize bytes holding b's data, and closes b
// (without freeing). The pointer stays the same unless the address space
// after the allocation is taken; no data is copied either way. When the
// allocation must move, Grow first waits for b's stream (or, with none,
// the device), so work already submitted on it is done before the old
// addresses are unmapped; work on other streams is the caller's to order,
// as for Close. A newSize not above b's size returns b unchanged. On error
// b is untouched. Grow consumes b: do not use b concurrently with it.
func (r *Resource) Grow(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	a, s, err := r.take("virtual.Grow", b)
	if err != nil {
		return nil, err
	}
	if newSize <= b.Size() {
		return b, nil
	}
	oldPtr := b.Ptr() // before r.mu: Buffer locks are never taken under r.mu
	r.mu.Lock()
	if r.allocs[oldPtr] != a {
		r.mu.Unlock()
		return nil, &cuda.OpError{Op: "virtual.Grow", Err: cuda.ErrClosed}
	}
	need := r.alignUp(newSize)
	if need < newSize {
		r.mu.Unlock()
		return nil, cuda.Errorf("virtual.Grow", cuda.ErrInvalidArgument, "size %d overflows", newSize)
	}
	if need > a.mapped {
		if err := r.extend(a, need, s); err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("virtual.Grow %#x to %d bytes: %w", uint64(oldPtr), newSize, err)
		}
	}
	r.rekey(oldPtr, a)
	a.size = newSize
	base := a.base
	r.mu.Unlock()
	return r.rewrap(b, base, newSize, s)
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

// extend maps memory so a covers need bytes. Called with r.mu held.
func (r *Resource) extend(a *allocation, need uint64, s *cuda.Stream) error {
	add := need - a.mapped
	reserved := a.reserved()
	var u undo
	if need > reserved {
		// Ask for the address space right after ours.
		hint := a.base + cuda.DevicePtr(reserved)
		extra := need - reserved
		p, err := r.dev.MemAddressReserve(extra, r.gran, hint)
		if err == nil && p != hint {
			r.dev.MemAddressFree(p, extra)
		}
		if err != nil || p != hint {
			return r.remap(a, need, s)
		}
		u.add(func() { r.dev.MemAddressFree(p, extra) })
		a.reservations = append(a.reservations, span{p, extra})
		u.add(func() { a.reservations = a.reservations[:len(a.reservations)-1] })
	}
	h, err := r.newChunk(a.base+cuda.DevicePtr(a.mapped), add, a.descs, &u)
	if err != nil {
		u.run()
		return err
	}
	a.chunks = append(a.chunks, chunk{off: a.mapped, size: add, h: h})
	a.mapped = need
	return nil
}

// remap builds the allocation again in a new range of need bytes: the old
// chunks are mapped there too (the same physical memory: nothing is
// copied), a new chunk fills the rest, then the old range is released. If
// anything fails the old allocation is left as it was.
func (r *Resource) remap(a *allocation, need uint64, s *cuda.Stream) error {
	reserve := max(need, r.alignUp(r.opts.Reserve))
	var u undo
	np, err := r.dev.MemAddressReserve(reserve, r.align, 0)
	if err != nil {
		return err
	}
	u.add(func() { r.dev.MemAddressFree(np, reserve) })
	for _, c := range a.chunks {
		at := np + cuda.DevicePtr(c.off)
		if err := r.dev.MemMap(at, c.size, 0, c.h); err != nil {
			u.run()
			return err
		}
		u.add(func() { r.dev.MemUnmap(at, c.size) })
		if err := r.dev.MemSetAccess(at, c.size, a.descs...); err != nil {
			u.run()
			return err
		}
	}
	h, err := r.newChunk(np+cuda.DevicePtr(a.mapped), need-a.mapped, a.descs, &u)
	if err != nil {
		u.run()
		return err
	}
	// The new range is complete. Work already submitted may still use the
	// old addresses: let it finish before they go.
	if err := r.wait(s); err != nil {
		u.run()
		return err
	}
	old := *a
	a.base, a.reservations = np, []span{{np, reserve}}
	a.chunks = append(append([]chunk(nil), old.chunks...), chunk{off: old.mapped, size: need - old.mapped, h: h})
	a.mapped = need
	for _, c := range old.chunks {
		r.dev.MemUnmap(old.base+cuda.DevicePtr(c.off), c.size)
	}
	for _, s := range old.reservations {
		r.dev.MemAddressFree(s.ptr, s.size)
	}
	return nil
}

// Shrink returns a buffer of newSize bytes holding the start of b's data,
// and closes b (without freeing). Whole chunks past the new size are
// unmapped and released; the address space stays reserved, so a later
// Grow back is in place. A newSize not below b's size returns b unchanged.
func (r *Resource) Shrink(b *buffer.Buffer, newSize uint64) (*buffer.Buffer, error) {
	a, s, err := r.take("virtual.Shrink", b)
	if err != nil {
		return nil, err
	}
	if newSize >= b.Size() {
		return b, nil
	}
	if newSize == 0 {
		return nil, cuda.Errorf("virtual.Shrink", cuda.ErrInvalidArgument, "new size 0: close the buffer instead")
	}
	if err := r.wait(s); err != nil {
		return nil, err
	}
	oldPtr := b.Ptr()
	r.mu.Lock()
	if r.allocs[oldPtr] != a {
		r.mu.Unlock()
		return nil, &cuda.OpError{Op: "virtual.Shrink", Err: cuda.ErrClosed}
	}
	need := r.alignUp(newSize)
	for len(a.chunks) > 1 {
		c := a.chunks[len(a.chunks)-1]
		if c.off < need {
			break
		}
		if err := r.dev.MemUnmap(a.base+cuda.DevicePtr(c.off), c.size); err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("virtual.Shrink %#x: %w", uint64(oldPtr), err)
		}
		a.chunks = a.chunks[:len(a.chunks)-1]
		a.mapped = c.off
		// Unmapped: the chunk is no longer part of the allocation even if
		// its release fails (then its memory leaks, and the error says so).
		if err := r.dev.MemRelease(c.h); err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("virtual.Shrink %#x: %w", uint64(oldPtr), err)
		}
	}
	a.size = newSize
	base := a.base
	r.mu.Unlock()
	return r.rewrap(b, base, newSize, s)
}

// SetPeerAccess sets the given devices' access to b's memory (NoAccess
// revokes it). The setting also applies to memory a later Grow adds.
func (r *Resource) SetPeerAccess(b *buffer.Buffer, access Access, peers ...*cuda.Device) error {
	a, _, err := r.take("virtual.SetPeerAccess", b)
	if err != nil {
		return err
	}
	f, err := access.flags()
	if err != nil {
		return cuda.Errorf("virtual.SetPeerAccess", cuda.ErrInvalidArgument, "%v", err)
	}
	descs := make([]cuda.MemAccessDesc, 0, len(peers))
	for _, p := range peers {
		if p == nil || p == r.dev {
			return cuda.Errorf("virtual.SetPeerAccess", cuda.ErrInvalidArgument, "peer %v is nil or the resource's own device", p)
		}
		if f != cuda.MemAccessProtNone {
			ok, err := p.CanAccessPeer(r.dev)
			if err != nil {
				return err
			}
			if !ok && r.opts.Location == OnDevice {
				return cuda.Errorf("virtual.SetPeerAccess", cuda.ErrInvalidArgument, "%v cannot access %v's memory", p, r.dev)
			}
		}
		descs = append(descs, cuda.MemAccessDesc{Location: devLoc(p), Flags: f})
	}
	if len(descs) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.dev.MemSetAccess(a.base, a.mapped, descs...); err != nil {
		return fmt.Errorf("virtual.SetPeerAccess %#x: %w", uint64(a.base), err)
	}
	for _, d := range descs {
		a.setDesc(d)
	}
	return nil
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
	a, _, err := r.take("virtual.Access", b)
	if err != nil {
		return NoAccess, err
	}
	if dev == nil {
		return NoAccess, cuda.Errorf("virtual.Access", cuda.ErrInvalidArgument, "nil device")
	}
	f, err := r.dev.MemGetAccess(a.base, devLoc(dev))
	if err != nil {
		return NoAccess, err
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
	a, _, err := r.take("virtual.Info", b)
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
