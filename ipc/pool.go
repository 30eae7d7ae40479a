package ipc

import (
	"fmt"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// ExportablePool is a pool resource that can be exported: an IPC-enabled
// resource.DevicePool or resource.PinnedPool.
type ExportablePool interface {
	buffer.MemoryResource
	Pool() cuda.MemPool
	IsIPCEnabled() bool
	IsClosed() bool
}

var (
	_ ExportablePool = (*resource.DevicePool)(nil)
	_ ExportablePool = (*resource.PinnedPool)(nil)
)

// exported remembers each exported pool's UUID, keyed by a weak pointer to
// the resource, so a pool keeps one UUID and a dead pool's entry can never
// be confused with a new pool that reuses its driver handle.
var exported struct {
	sync.Mutex
	ids map[any]UUID
}

func weakKey(p ExportablePool) (any, error) {
	switch v := p.(type) {
	case *resource.DevicePool:
		return weak.Make(v), nil
	case *resource.PinnedPool:
		return weak.Make(v), nil
	}
	return nil, cuda.Errorf("ipc.ExportPool", cuda.ErrInvalidArgument, "%T is not an exportable pool", p)
}

func alive(k any) bool {
	switch w := k.(type) {
	case weak.Pointer[resource.DevicePool]:
		return w.Value() != nil
	case weak.Pointer[resource.PinnedPool]:
		return w.Value() != nil
	}
	return false
}

// poolUUID returns p's UUID, making one on first use.
func poolUUID(p ExportablePool) (UUID, error) {
	k, err := weakKey(p)
	if err != nil {
		return UUID{}, err
	}
	exported.Lock()
	defer exported.Unlock()
	if u, ok := exported.ids[k]; ok {
		return u, nil
	}
	if exported.ids == nil {
		exported.ids = map[any]UUID{}
	}
	for old := range exported.ids {
		if !alive(old) {
			delete(exported.ids, old)
		}
	}
	u := NewUUID()
	exported.ids[k] = u
	return u, nil
}

func checkExportable(op string, p ExportablePool) error {
	if p == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil pool")
	}
	if p.IsClosed() {
		return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if !p.IsIPCEnabled() {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "memory resource is not IPC-enabled (create the pool with IPC set)")
	}
	return nil
}

// ExportPool exports an IPC-enabled pool as a new Handle, which the caller
// owns and closes. Every export of one pool carries the same UUID.
func ExportPool(p ExportablePool) (*Handle, error) {
	const op = "ipc.ExportPool"
	if ip, ok := p.(*ImportedPool); ok {
		return ip.Export()
	}
	if p == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil pool")
	}
	if err := checkExportable(op, p); err != nil {
		return nil, err
	}
	u, err := poolUUID(p)
	if err != nil {
		return nil, err
	}
	fd, err := p.Pool().ExportFD()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	return NewHandle(fd, u)
}

// ExportBuffer describes b, a whole buffer of an IPC-enabled pool (or of
// an imported pool: re-export), for a process that imported the pool. It
// first waits for b's allocation stream: the driver exports only
// allocations that exist, and a stream-ordered allocation exists once its
// stream reaches it (exporting earlier fails with CUDA_ERROR_INVALID_VALUE).
func ExportBuffer(b *buffer.Buffer) (Descriptor, error) {
	const op = "ipc.ExportBuffer"
	if b == nil || b.IsClosed() {
		return Descriptor{}, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if !b.IsOwned() {
		return Descriptor{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is a view or borrowed: export the whole allocation", b)
	}
	switch mr := b.Resource().(type) {
	case *ImportedPool:
		return mr.descriptor(b)
	case ExportablePool:
		if err := checkExportable(op, mr); err != nil {
			return Descriptor{}, err
		}
		u, err := poolUUID(mr)
		if err != nil {
			return Descriptor{}, err
		}
		if s := b.Stream(); s != nil {
			if err := s.Sync(); err != nil {
				return Descriptor{}, &cuda.OpError{Op: op, Err: err}
			}
		}
		var data cuda.MemPoolPtrExportData
		size := b.Size()
		err = b.Use(op, func(ptr cuda.DevicePtr) error {
			var err error
			if data, err = mr.Pool().ExportPointer(ptr); err != nil {
				return &cuda.OpError{Op: op, Err: fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err)}
			}
			return nil
		})
		if err != nil {
			return Descriptor{}, err
		}
		return Descriptor{Pool: u, Size: b.Size(), Data: data}, nil
	default:
		return Descriptor{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v comes from %T, not an exportable pool", b, mr)
	}
}

// ImportedPool is a pool exported by another process and mapped here. It
// cannot allocate; Import turns descriptors into Buffers of its memory.
// Importing the same pool (by UUID) again returns the same ImportedPool
// until it is closed.
type ImportedPool struct {
	dev  *cuda.Device
	pool cuda.MemPool
	uuid UUID
	fd   int // a duplicate of the imported fd, kept for re-export

	live    atomic.Int64
	closing atomic.Bool
	mu      sync.RWMutex
	closed  bool
	gone    bool // the driver pool was destroyed
	// destroyErr is a failed destroy from the last Deallocate, reported
	// (and retried) by Close.
	destroyErr error

	descMu sync.Mutex
	descs  map[cuda.DevicePtr]Descriptor // imported buffers, for re-export
}

var _ buffer.MemoryResource = (*ImportedPool)(nil)

var registry struct {
	sync.Mutex
	pools map[UUID]*ImportedPool
}

// ImportPool maps the pool h describes on dev. The handle stays the
// caller's to close. A pool already imported (same UUID) is returned as is.
func ImportPool(dev *cuda.Device, h *Handle) (*ImportedPool, error) {
	const op = "ipc.ImportPool"
	if dev == nil || h == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device or handle")
	}
	registry.Lock()
	defer registry.Unlock()
	if p := registry.pools[h.UUID()]; p != nil {
		if p.dev != dev {
			return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "pool %v is already imported on %v, not %v", h.UUID(), p.dev, dev)
		}
		return p, nil
	}
	fd, err := h.FD()
	if err != nil {
		return nil, err
	}
	pool, err := dev.ImportMemPoolFD(fd)
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("pool %v: %w", h.UUID(), err)}
	}
	keep, err := dup(fd)
	if err != nil {
		_ = pool.Destroy()
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	p := &ImportedPool{dev: dev, pool: pool, uuid: h.UUID(), fd: keep, descs: map[cuda.DevicePtr]Descriptor{}}
	if registry.pools == nil {
		registry.pools = map[UUID]*ImportedPool{}
	}
	registry.pools[p.uuid] = p
	return p, nil
}

// Lookup returns the imported pool with the given UUID, if any.
func Lookup(u UUID) (*ImportedPool, bool) {
	registry.Lock()
	defer registry.Unlock()
	p, ok := registry.pools[u]
	return p, ok
}

// UUID names the exporting pool.
func (p *ImportedPool) UUID() UUID { return p.uuid }

// Pool is the imported driver pool (the zero MemPool once closed).
func (p *ImportedPool) Pool() cuda.MemPool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return cuda.MemPool{}
	}
	return p.pool
}

// IsIPCEnabled reports true: an imported pool can be exported again.
func (p *ImportedPool) IsIPCEnabled() bool { return true }

// IsClosed reports whether Close was called.
func (p *ImportedPool) IsClosed() bool {
	if p == nil || p.dev == nil {
		return true
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.closed
}

// Export hands out a new Handle to this pool (a duplicate of the imported
// fd, with the owner's UUID), so a third process can import it.
func (p *ImportedPool) Export() (*Handle, error) {
	if p == nil || p.dev == nil {
		return nil, cuda.Errorf("ImportedPool.Export", cuda.ErrInvalidArgument, "nil or zero *ImportedPool")
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, &cuda.OpError{Op: "ImportedPool.Export", Err: cuda.ErrClosed}
	}
	fd, err := dup(p.fd)
	if err != nil {
		return nil, &cuda.OpError{Op: "ImportedPool.Export", Err: err}
	}
	return NewHandle(fd, p.uuid)
}

// Import maps the buffer d describes, ordered on s (nil: the device's
// legacy default stream). Closing the buffer unmaps it here; the owner's
// memory lives until the owner frees it.
func (p *ImportedPool) Import(d Descriptor, s *cuda.Stream) (*buffer.Buffer, error) {
	const op = "ImportedPool.Import"
	if p == nil || p.dev == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil or zero *ImportedPool (use ImportPool)")
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if d.Pool != p.uuid {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "descriptor of pool %v given to imported pool %v", d.Pool, p.uuid)
	}
	ptr, err := p.pool.ImportPointer(&d.Data)
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes from pool %v: %w", d.Size, p.uuid, err)}
	}
	// The checksum guards against corruption, not lies: never let a
	// descriptor claim more than the mapping holds.
	if info, err := cuda.QueryPointer(ptr); err != nil || info.RangeBase+cuda.DevicePtr(info.RangeSize) < ptr+cuda.DevicePtr(d.Size) {
		if s == nil {
			s = p.dev.DefaultStream()
		}
		_ = s.MemFreeAsync(ptr)
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "descriptor claims %d bytes, the imported allocation holds %d (%v)", d.Size, info.RangeSize, err)
	}
	p.live.Add(1)
	p.descMu.Lock()
	p.descs[ptr] = d
	p.descMu.Unlock()
	if s == nil {
		s = p.dev.DefaultStream()
	}
	return buffer.Owned(ptr, d.Size, p, s), nil
}

func (p *ImportedPool) descriptor(b *buffer.Buffer) (Descriptor, error) {
	p.descMu.Lock()
	defer p.descMu.Unlock()
	d, ok := p.descs[b.Ptr()]
	if !ok {
		return Descriptor{}, cuda.Errorf("ipc.ExportBuffer", cuda.ErrInvalidArgument, "%v is not a buffer imported into pool %v", b, p.uuid)
	}
	return d, nil
}

// Allocate always fails: memory comes from the exporting process.
func (p *ImportedPool) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	if p == nil {
		return nil, cuda.Errorf("ImportedPool.Allocate", cuda.ErrInvalidArgument, "nil *ImportedPool")
	}
	return nil, cuda.Errorf("ImportedPool.Allocate", cuda.ErrInvalidArgument, "cannot allocate from an imported (mapped) IPC memory pool %v", p.uuid)
}

// Deallocate unmaps an imported buffer in stream order (buffers call it
// from Close). It keeps working after Close; the last one destroys the
// imported pool.
func (p *ImportedPool) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if s == nil {
		s = p.dev.DefaultStream()
	}
	if err := s.MemFreeAsync(ptr); err != nil {
		return &cuda.OpError{Op: "ImportedPool.Deallocate", Err: fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err)}
	}
	p.descMu.Lock()
	delete(p.descs, ptr)
	p.descMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live.Add(-1) <= 0 && p.closing.Load() {
		// The free succeeded, so the buffer is closed whatever happens next:
		// a failed destroy is kept and reported by the next Close.
		p.destroyErr = p.destroyLocked()
	}
	return nil
}

// DeviceAccessible reports true.
func (p *ImportedPool) DeviceAccessible() bool { return true }

// HostAccessible reports false.
func (p *ImportedPool) HostAccessible() bool { return false }

// DeviceID is the importing device's ordinal.
func (p *ImportedPool) DeviceID() int {
	if p == nil || p.dev == nil {
		return -1
	}
	return p.dev.Ordinal()
}

// Close forgets the pool (a later ImportPool maps it afresh), closes the
// kept fd and, once no imported buffer is left, destroys the mapping.
// It is idempotent.
func (p *ImportedPool) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		if p.destroyErr != nil {
			p.destroyErr = p.destroyLocked()
			return p.destroyErr
		}
		return nil
	}
	p.closed = true
	p.closing.Store(true)
	registry.Lock()
	if registry.pools[p.uuid] == p {
		delete(registry.pools, p.uuid)
	}
	registry.Unlock()
	err := closeFD(p.fd)
	p.fd = -1
	if p.live.Load() <= 0 {
		if derr := p.destroyLocked(); derr != nil && err == nil {
			err = derr
		}
	}
	return err
}

func (p *ImportedPool) destroyLocked() error {
	if p.gone {
		return nil
	}
	// Let the frees complete before the pool goes.
	if err := p.dev.Sync(); err != nil {
		return err
	}
	if err := p.pool.Destroy(); err != nil {
		return err
	}
	p.gone = true
	return nil
}

// String describes the pool.
func (p *ImportedPool) String() string {
	return fmt.Sprintf("ImportedPool(%v on %v)", p.uuid, p.dev)
}
