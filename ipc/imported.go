package ipc

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
	"github.com/cudamem/cudamem/internal/poolcore"
)

// importDriver is the driver work of an imported pool. Tests substitute a
// fake that models what the C fake driver does not: one mapping per
// allocation and process, and a call held inside the driver while Close
// and other imports race it.
type importDriver interface {
	importPointer(data *cuda.MemPoolPtrExportData) (cuda.DevicePtr, error)
	// mapping returns the start and size of the allocation containing ptr.
	mapping(ptr cuda.DevicePtr) (base cuda.DevicePtr, size uint64, err error)
	free(ptr cuda.DevicePtr, s *cuda.Stream) error
	// destroy waits for pending frees and destroys the imported pool.
	destroy() error
	defaultStream() *cuda.Stream
}

type cudaImport struct {
	dev  *cuda.Device
	pool cuda.MemPool
}

func (c cudaImport) importPointer(d *cuda.MemPoolPtrExportData) (cuda.DevicePtr, error) {
	return c.pool.ImportPointer(d)
}

func (c cudaImport) mapping(ptr cuda.DevicePtr) (cuda.DevicePtr, uint64, error) {
	return mappingOf(c.dev, ptr)
}

func (c cudaImport) free(ptr cuda.DevicePtr, s *cuda.Stream) error {
	if s == nil {
		s = c.dev.DefaultStream()
	}
	return s.MemFreeAsync(ptr)
}

func (c cudaImport) destroy() error {
	// Let the frees complete before the pool goes.
	if err := c.dev.Sync(); err != nil {
		return fmt.Errorf("wait for %v before destroying the imported pool: %w", c.dev, err)
	}
	return c.pool.Destroy()
}

func (c cudaImport) defaultStream() *cuda.Stream { return c.dev.DefaultStream() }

// imported is one allocation mapped from the exporter.
type imported struct {
	data  cuda.MemPoolPtrExportData
	limit uint64 // bytes the driver's mapping holds from the pointer on
	refs  int    // Buffers handed out for it
}

// ImportedPool is a pool exported by another process and mapped here. It
// cannot allocate; Import turns descriptors into Buffers of its memory.
// Importing the same pool (by UUID) again returns the same ImportedPool
// until it is closed.
//
// The driver maps an allocation once per process (importing a descriptor
// twice returns the same pointer, and one free unmaps it), so the pool
// counts its Buffers per pointer and the last Close frees.
//
// A pool imported from a Handle with a key imports only descriptors that
// key authenticates; one imported from a keyless Handle refuses every
// descriptor in Import (see ImportUnauthenticated and the package doc).
//
// The zero ImportedPool is not usable (use ImportPool); its methods report
// errors matching cuda.ErrInvalidArgument, and its Close does nothing.
type ImportedPool struct {
	dev  *cuda.Device
	pool cuda.MemPool
	drv  importDriver // nil in the zero value
	uuid UUID
	key  poolKey // from the Handle; forwarded by Export
	// file (an fd import) or fabric (a fabric import) is kept for re-export.
	file   *osfd.File
	fabric fabricBytes

	// life counts the Buffers handed out and destroys the imported pool
	// after the last one once closed. Import and Export run between
	// Enter and Leave, so Close waits for them.
	life poolcore.Core

	// mapMu orders imports and frees of pointers, so that a pointer the
	// driver hands out again is never freed by one goroutine while another
	// counts a new Buffer on it.
	mapMu sync.Mutex
	maps  map[cuda.DevicePtr]*imported
}

var _ buffer.MemoryResource = (*ImportedPool)(nil)

// registry holds every imported pool of this process by UUID until its
// destruction, closed ones included: a second pool of a closed one's UUID
// could be handed the very pointers its open Buffers use, and closing
// either would unmap the other's memory.
//
// The driver's import runs outside the lock: pending holds the UUIDs being
// imported, and a second import of one waits for the first, then looks
// again, so a UUID is still mapped once.
//
// Lock order: a pool's core (held while it is destroyed) before registry;
// under registry only a pool's atomics are read, and no driver call or
// wait is made.
var registry struct {
	sync.Mutex
	pools   map[UUID]*ImportedPool
	pending map[UUID]chan struct{} // closed when the import in progress ends
}

// registered returns the pool registered for u that ImportPool may return
// for dev (nil if none). A pool of u on another device, one closed and
// not yet destroyed, or one imported under another key is an error.
// registry is held.
func registered(op string, dev *cuda.Device, u UUID, k poolKey) (*ImportedPool, error) {
	p := registry.pools[u]
	switch {
	case p == nil:
		return nil, nil
	case p.life.IsClosed():
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%w: pool %v was closed here but is not destroyed yet (%d of its Buffers open, or its destruction failed and awaits another Close); import it again after that",
			cuda.ErrClosed, u, p.life.Live())}
	case p.dev != dev && !p.dev.SameGPU(dev): // pools belong to the GPU, whatever the view
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "pool %v is already imported on %v, not %v", u, p.dev, dev)
	case !p.key.equal(k):
		// Another key under the same UUID is another exporter claiming
		// the pool's name.
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "pool %v is already imported here under another pool key (or with a key where this Handle has none, or the reverse)", u)
	}
	return p, nil
}

func newImportedPool(dev *cuda.Device, pool cuda.MemPool, drv importDriver, u UUID, k poolKey, file *osfd.File) *ImportedPool {
	p := &ImportedPool{dev: dev, pool: pool, drv: drv, uuid: u, key: k, file: file, maps: map[cuda.DevicePtr]*imported{}}
	p.life.SetName(func() string { return fmt.Sprintf("ImportedPool %v on %v", u, dev) })
	p.life.SetDestroy(func() error {
		// Waiting for the device during a capture of its context would
		// invalidate the capture: the destruction waits for it to end.
		for {
			if dev.DeferWhileCapturing(func() { _ = p.life.Retry() }) {
				return poolcore.ErrDeferred
			}
			err := drv.destroy()
			if err == nil {
				break
			}
			if !errors.Is(err, cuda.ErrCapturing) {
				return err
			}
			// A capture began since the check, and may have ended
			// since the refusal: look again (defer, or destroy now).
		}
		registry.Lock()
		if registry.pools[u] == p {
			delete(registry.pools, u)
		}
		registry.Unlock()
		return nil
	})
	return p
}

// importPoolFD imports the pool behind fd on dev; fd stays the caller's.
// Tests substitute it to hold an import inside the driver.
var importPoolFD = func(dev *cuda.Device, fd int) (cuda.MemPool, importDriver, error) {
	pool, err := dev.ImportMemPoolFD(fd)
	if err != nil {
		return cuda.MemPool{}, nil, err
	}
	return pool, cudaImport{dev: dev, pool: pool}, nil
}

// importOnce returns the pool registered for u, or registers the one
// doImport makes, which runs with no lock held (see registry).
func importOnce(op string, dev *cuda.Device, u UUID, k poolKey, doImport func() (*ImportedPool, error)) (*ImportedPool, error) {
	for {
		registry.Lock()
		if p, err := registered(op, dev, u, k); p != nil || err != nil {
			registry.Unlock()
			return p, err
		}
		if wait := registry.pending[u]; wait != nil {
			registry.Unlock()
			<-wait
			continue
		}
		done := make(chan struct{})
		if registry.pending == nil {
			registry.pending = map[UUID]chan struct{}{}
		}
		registry.pending[u] = done
		registry.Unlock()
		return importPending(u, done, doImport)
	}
}

// importPending runs doImport and registers its pool. The pending entry
// is removed and the waiters woken however doImport ends, a panic included.
func importPending(u UUID, done chan struct{}, doImport func() (*ImportedPool, error)) (p *ImportedPool, err error) {
	defer func() {
		registry.Lock()
		delete(registry.pending, u)
		if p != nil && err == nil {
			if registry.pools == nil {
				registry.pools = map[UUID]*ImportedPool{}
			}
			registry.pools[u] = p
		}
		registry.Unlock()
		close(done)
	}()
	return doImport()
}

// ImportPool maps the pool h describes on dev. The handle stays the
// caller's to close. A pool already imported (same UUID) is returned as
// is; a Handle with the same UUID but another key (or a key where the
// first had none, or the reverse) is refused. A pool closed here but not
// yet destroyed (Buffers still open) is refused with cuda.ErrClosed.
//
// h's fd is hostile input: one of a kind the driver's export never is (a
// pipe, FIFO, socket, regular file, directory, symbolic link or block
// device) is refused with an error matching cuda.ErrInvalidArgument
// before the driver sees it. A slow or stuck driver import holds up only
// other imports of the same UUID. A closed h gives cuda.ErrClosed.
func ImportPool(dev *cuda.Device, h *Handle) (*ImportedPool, error) {
	const op = "ipc.ImportPool"
	if dev == nil || h == nil || h.f == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device, or nil or zero handle")
	}
	u, k := h.UUID(), h.key
	if u == (UUID{}) {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "handle with the zero UUID (imports are deduplicated by UUID)")
	}
	// Checked first, even when u is imported already: a closed Handle or
	// one holding something other than a pool is refused, not answered.
	if err := h.use(op, func(fd int) error { return checkPoolFD(op, fd) }); err != nil {
		return nil, err
	}
	return importOnce(op, dev, u, k, func() (*ImportedPool, error) {
		// The driver reads the pool's own duplicate: h may be closed meanwhile.
		var keep *osfd.File
		err := h.use(op, func(fd int) error {
			var err error
			if keep, err = osfd.DupInt(fd); err != nil {
				return &cuda.OpError{Op: op, Err: fmt.Errorf("pool %v: %w", u, err)}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		var pool cuda.MemPool
		var drv importDriver
		err = keep.Use(func(fd int) error {
			var err error
			pool, drv, err = importPoolFD(dev, fd)
			return err
		})
		if err != nil {
			err = &cuda.OpError{Op: op, Err: fmt.Errorf("pool %v: %w", u, err)}
			if cerr := keep.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
			return nil, err
		}
		return newImportedPool(dev, pool, drv, u, k, keep), nil
	})
}

// Lookup returns the open imported pool with the given UUID, if any (a
// closed one is not returned, though it blocks a new import of its UUID
// until it is destroyed; see ImportPool).
func Lookup(u UUID) (*ImportedPool, bool) {
	registry.Lock()
	defer registry.Unlock()
	p := registry.pools[u]
	if p == nil || p.life.IsClosed() {
		return nil, false
	}
	return p, true
}

func (p *ImportedPool) zero() bool { return p == nil || p.drv == nil }

func errZeroPool(op string) error {
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil or zero *ImportedPool (use ImportPool)")
}

func (p *ImportedPool) errClosed(op string) error {
	return &cuda.OpError{Op: op, Err: fmt.Errorf("%w: imported pool %v", cuda.ErrClosed, p.uuid)}
}

// enter holds p open for a call (life.Leave ends it), refusing a nil, zero
// or closed pool.
func (p *ImportedPool) enter(op string) error {
	if p.zero() {
		return errZeroPool(op)
	}
	if !p.life.Enter() {
		return p.errClosed(op)
	}
	return nil
}

// UUID names the exporting pool.
func (p *ImportedPool) UUID() UUID {
	if p == nil {
		return UUID{}
	}
	return p.uuid
}

// Pool is the imported driver pool (the zero MemPool once closed).
func (p *ImportedPool) Pool() cuda.MemPool {
	if p.zero() || p.life.IsClosed() {
		return cuda.MemPool{}
	}
	return p.pool
}

// IsIPCEnabled reports true: an imported pool can be exported again.
func (p *ImportedPool) IsIPCEnabled() bool { return !p.zero() }

// IsClosed reports whether Close was called (true for a nil or zero pool).
func (p *ImportedPool) IsClosed() bool {
	return p.zero() || p.life.IsClosed()
}

// Live returns how many Buffers of the pool are open here (each Import
// counts one, duplicates of one mapping included).
func (p *ImportedPool) Live() int64 {
	if p.zero() {
		return 0
	}
	return p.life.Live()
}

// export is ExportPool of an imported pool (A to B to C): a duplicate of
// the imported fd, with the owner's UUID and key.
func (p *ImportedPool) export() (*Handle, error) {
	const op = "ipc.ExportPool"
	if err := p.enter(op); err != nil {
		return nil, err
	}
	defer p.life.Leave()
	if p.file == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "pool %v was imported from a fabric handle, not a file descriptor (use ExportPoolFabric)", p.uuid)
	}
	f, err := p.file.Dup()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("pool %v: %w", p.uuid, err)}
	}
	return &Handle{uuid: p.uuid, key: p.key, f: f}, nil
}

// Import maps the buffer d describes, ordered on s (nil: the device's
// legacy default stream); closing the buffer unmaps it. A stream that
// captures (or nil while a blocking stream of the device captures) is
// refused with an error matching cuda.ErrCapturing before anything is
// imported: an imported mapping is not graph memory.
//
// A descriptor is hostile input, and every refusal of one wraps
// ErrBadDescriptor (which matches cuda.ErrInvalidArgument too): one naming
// another pool or of size 0, one the pool's key does not authenticate,
// every descriptor when the pool has no key (see ImportUnauthenticated),
// and one claiming more than the driver's mapping. Only a descriptor the
// key vouches for reaches the driver. Importing memory already imported
// returns another Buffer on the same mapping. A concurrent Close waits
// for the import; one after Close began fails with cuda.ErrClosed.
func (p *ImportedPool) Import(d Descriptor, s *cuda.Stream) (*buffer.Buffer, error) {
	const op = "ImportedPool.Import"
	if err := p.checkDescriptor(op, d); err != nil {
		return nil, err
	}
	if !p.key.has() {
		return nil, cuda.Errorf(op, ErrBadDescriptor, "imported pool %v has no pool key (its Handle came without one), so no descriptor can be authenticated; for an exporter that is not cudamem, ImportUnauthenticated takes a buffer's raw parts unchecked", p.uuid)
	}
	if !p.key.verify(d) {
		return nil, cuda.Errorf(op, ErrBadDescriptor, "descriptor of %d bytes is not authenticated by the key of pool %v (forged, altered, or sealed by another exporter): refused before the driver saw it", d.Size, p.uuid)
	}
	return p.importChecked(op, d, s)
}

// ImportUnauthenticated maps a buffer of this pool by the raw parts an
// exporter that is not cudamem sends: the 64 bytes of the pointer's export
// data (cuda.core's IPCBufferDescriptor payload, a C program's
// CUmemPoolPtrExportData, or Descriptor.ExportData) and the buffer's size.
// It is for pools imported without a key, and hands the export data to the
// driver unchecked: the size is still bounded by the driver's mapping, but
// malformed data can crash this process inside the driver. Use it only
// with buffers from an exporter this process trusts as itself. A pool with
// a key refuses it (cuda.ErrInvalidArgument): use Import. Export data of
// the wrong length or all zeros, and a size of 0, are refused with an
// error wrapping ErrBadDescriptor. Otherwise it behaves as Import.
func (p *ImportedPool) ImportUnauthenticated(exportData []byte, size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	const op = "ImportedPool.ImportUnauthenticated"
	if err := p.checkOpen(op); err != nil {
		return nil, err
	}
	if p.key.has() {
		// Every descriptor of a keyed pool is sealed: one that is not is
		// forged (and re-export would seal the forgery).
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "pool %v has a key: its descriptors are imported with Import, which checks their MAC", p.uuid)
	}
	d := Descriptor{Pool: p.uuid, Size: size}
	switch {
	case len(exportData) != len(d.Data.Reserved):
		return nil, cuda.Errorf(op, ErrBadDescriptor, "export data of %d bytes, want %d", len(exportData), len(d.Data.Reserved))
	case bytes.Count(exportData, []byte{0}) == len(exportData):
		return nil, cuda.Errorf(op, ErrBadDescriptor, "export data is all zeros (not from cuMemPoolExportPointer)")
	}
	copy(d.Data.Reserved[:], exportData)
	if err := p.checkDescriptor(op, d); err != nil {
		return nil, err
	}
	return p.importChecked(op, d, s)
}

// checkDescriptor makes the checks that need neither the key nor the
// driver; every wrong field is ErrBadDescriptor, as a wrong MAC is.
func (p *ImportedPool) checkDescriptor(op string, d Descriptor) error {
	if err := p.checkOpen(op); err != nil {
		return err
	}
	if d.Pool != p.uuid {
		return cuda.Errorf(op, ErrBadDescriptor, "descriptor of pool %v (%d bytes) given to imported pool %v", d.Pool, d.Size, p.uuid)
	}
	if d.Size == 0 {
		return cuda.Errorf(op, ErrBadDescriptor, "descriptor of 0 bytes (pool %v)", d.Pool)
	}
	return nil
}

// checkOpen refuses a nil, zero or closed pool before the arguments are
// looked at (the calls still Enter, which a racing Close makes fail).
func (p *ImportedPool) checkOpen(op string) error {
	if p.zero() {
		return errZeroPool(op)
	}
	if p.life.IsClosed() {
		return p.errClosed(op)
	}
	return nil
}

// importChecked maps d, whose export data the caller has decided to hand
// to the driver, and bounds it by the driver's mapping.
func (p *ImportedPool) importChecked(op string, d Descriptor, s *cuda.Stream) (*buffer.Buffer, error) {
	if err := p.enter(op); err != nil {
		return nil, err
	}
	defer p.life.Leave()
	// s is checked before the driver maps anything: a refused mapping is
	// unmapped on it, and on a stream that cannot be used or captures (an
	// imported pointer is not graph memory) that free would fail or become
	// a graph node, leaving the mapping behind.
	if s == nil {
		s = p.drv.defaultStream()
	} else if _, err := p.dev.ResolveStream(op, s, true); err != nil {
		return nil, err
	}
	if err := s.RefuseCapture(op); err != nil {
		return nil, fmt.Errorf("%w (descriptor of %d bytes from pool %v not imported)", err, d.Size, p.uuid)
	}
	p.mapMu.Lock()
	defer p.mapMu.Unlock()
	ptr, err := p.drv.importPointer(&d.Data)
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%d bytes from pool %v: %w", d.Size, p.uuid, err)}
	}
	if m := p.maps[ptr]; m != nil {
		// Buffers here already use this mapping: a refusal must not unmap it.
		if d.Size > m.limit {
			return nil, cuda.Errorf(op, ErrBadDescriptor, "descriptor claims %d bytes, the imported allocation holds %d at %#x", d.Size, m.limit, uint64(ptr))
		}
		m.refs++
		// Counted before Leave, so a Close waiting for this call sees it.
		p.life.Allocated()
		return buffer.Owned(ptr, d.Size, p, s), nil
	}
	// Never let a descriptor claim more than the mapping holds.
	base, size, err := p.drv.mapping(ptr)
	limit, ok := within(ptr, d.Size, base, size)
	if err != nil || !ok {
		if err != nil {
			err = &cuda.OpError{Op: op, Err: fmt.Errorf("asking the driver for the mapping at %#x: %w", uint64(ptr), err)}
		} else {
			err = cuda.Errorf(op, ErrBadDescriptor, "descriptor claims %d bytes, the imported allocation holds %d at %#x (allocation %#x+%d)", d.Size, limit, uint64(ptr), uint64(base), size)
		}
		// This import made the mapping, and nothing else uses it.
		if ferr := p.drv.free(ptr, s); ferr != nil {
			err = errors.Join(err, fmt.Errorf("unmapping the refused buffer %#x: %w", uint64(ptr), ferr))
		}
		return nil, err
	}
	p.maps[ptr] = &imported{data: d.Data, limit: limit, refs: 1}
	p.life.Allocated()
	return buffer.Owned(ptr, d.Size, p, s), nil
}

func (p *ImportedPool) descriptor(b *buffer.Buffer) (Descriptor, error) {
	const op = "ipc.ExportBuffer"
	if p.zero() {
		return Descriptor{}, errZeroPool(op)
	}
	// A closed pool exports nothing more, as a closed DevicePool does.
	if !p.life.Enter() {
		return Descriptor{}, &cuda.OpError{Op: op, Err: fmt.Errorf("%w: %v is a buffer of imported pool %v, which was closed", cuda.ErrClosed, b, p.uuid)}
	}
	defer p.life.Leave()
	var d Descriptor
	err := b.Use(op, func(ptr cuda.DevicePtr) error {
		p.mapMu.Lock()
		defer p.mapMu.Unlock()
		m := p.maps[ptr]
		if m == nil {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is not a buffer imported into pool %v", b, p.uuid)
		}
		// Sealed with the key this pool came with (A to B to C).
		d = p.key.seal(Descriptor{Pool: p.uuid, Size: b.Size(), Data: m.data})
		return nil
	})
	return d, err
}

// Allocate always fails: memory comes from the exporting process.
func (p *ImportedPool) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(p, size, s)
}

// AllocatePtr always fails, as Allocate does ([buffer.MemoryResource]).
func (p *ImportedPool) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if p.zero() {
		return 0, nil, errZeroPool("ImportedPool.Allocate")
	}
	return 0, nil, cuda.Errorf("ImportedPool.Allocate", cuda.ErrInvalidArgument, "cannot allocate from an imported (mapped) IPC memory pool %v", p.uuid)
}

// Deallocate ends one imported Buffer (buffers call it from Close). The
// last Buffer on a mapping unmaps it in stream order; a pointer this pool
// did not hand out is refused without calling the driver. After Close,
// the last one destroys the imported pool (a failed destruction is
// reported and retried by the next Close).
func (p *ImportedPool) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "ImportedPool.Deallocate"
	if ptr == 0 {
		return nil
	}
	if p.zero() {
		return errZeroPool(op)
	}
	// An imported pointer is not graph memory: a free captured into a
	// graph would not be a free now.
	if s == nil {
		s = p.drv.defaultStream()
	}
	if err := s.RefuseCapture(op); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays mapped)", err, uint64(ptr), size)
	}
	p.mapMu.Lock()
	m := p.maps[ptr]
	switch {
	case m == nil || !p.life.HasLive():
		// Refused before the driver could free another pool's memory.
		p.mapMu.Unlock()
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) is not a live buffer of imported pool %v", uint64(ptr), size, p.uuid)
	case m.refs > 1:
		m.refs--
	default:
		if err := p.drv.free(ptr, s); err != nil {
			p.mapMu.Unlock()
			// Still mapped and counted: the Buffer stays open for a retry.
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err)}
		}
		delete(p.maps, ptr)
	}
	p.mapMu.Unlock()
	// Outside mapMu: Freed may destroy the pool, which waits for the
	// device. Its error is kept by the core for the next Close.
	_ = p.life.Freed()
	return nil
}

// DeviceAccessible reports true.
func (p *ImportedPool) DeviceAccessible() bool { return !p.zero() }

// HostAccessible reports false.
func (p *ImportedPool) HostAccessible() bool { return false }

// DeviceID is the importing device's ordinal.
func (p *ImportedPool) DeviceID() int {
	if p.zero() || p.dev == nil {
		return -1
	}
	return p.dev.Ordinal()
}

// Close waits for the Imports and Exports in progress, closes the kept fd
// and, once no imported Buffer is left, destroys the mapping (else the
// last Buffer's Close does); then a later ImportPool maps it afresh. It is
// idempotent; a failed destruction is retried and reported by the next
// Close. It does nothing on a nil or zero pool.
func (p *ImportedPool) Close() error {
	const op = "ImportedPool.Close"
	if p.zero() {
		return nil
	}
	var errs []error
	// Waits for the calls in progress, so no Export is duplicating the fd.
	if err := p.life.Close(); err != nil {
		errs = append(errs, fmt.Errorf("destroying imported pool %v: %w", p.uuid, err))
	}
	// A failed close still releases the fd: reported once, not retried.
	if err := p.file.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	return nil
}

// String describes the pool.
func (p *ImportedPool) String() string {
	if p.zero() {
		return "ImportedPool(nil)"
	}
	return fmt.Sprintf("ImportedPool(%v on %v)", p.uuid, p.dev)
}
