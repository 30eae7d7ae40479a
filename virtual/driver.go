package virtual

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// driver is the seam between this package and the CUDA driver: every
// driver call the resource makes goes through it, so CPU tests can put a
// fake behind a Resource and check what a failed operation left behind.
// The C fake driver the other packages' tests use cannot stand in for it:
// it reports counts, not the reservations, mappings (with their handles
// and access) and handles these tests compare before and after; it fails
// calls only in builds with the fault-injection tag, and cannot fail every
// call from the k-th on or grant a reservation off the alignment asked
// for. The real implementation, device, is a struct of one pointer: a
// call costs one indirect call on top of the driver's own.
type driver interface {
	Features() (cuda.Features, error)
	AllocationGranularity(prop *cuda.MemAllocationProp, kind cuda.MemAllocationGranularity) (uint64, error)
	MemCreate(size uint64, prop *cuda.MemAllocationProp) (cuda.MemHandle, error)
	MemRelease(h cuda.MemHandle) error
	MemAddressReserve(size, alignment uint64, hint cuda.DevicePtr) (cuda.DevicePtr, error)
	MemAddressFree(ptr cuda.DevicePtr, size uint64) error
	MemMap(ptr cuda.DevicePtr, size, offset uint64, h cuda.MemHandle) error
	MemUnmap(ptr cuda.DevicePtr, size uint64) error
	MemSetAccess(ptr cuda.DevicePtr, size uint64, descs ...cuda.MemAccessDesc) error
	MemGetAccess(ptr cuda.DevicePtr, loc cuda.MemLocation) (cuda.MemAccessFlags, error)
	// For Export and Import (export.go).
	MemExportFD(h cuda.MemHandle) (int, error)
	MemImportFD(fd int) (cuda.MemHandle, error)
	// For ExportFabric and ImportFabric (fabric.go).
	FabricHandlesSupported() (bool, error)
	MemExportFabric(h cuda.MemHandle) (cuda.MemFabricHandle, error)
	MemImportFabric(fh *cuda.MemFabricHandle) (cuda.MemHandle, error)
	MemAllocationProperties(h cuda.MemHandle) (cuda.MemAllocationProp, error)
	MemRetainAllocationHandle(addr cuda.DevicePtr) (cuda.MemHandle, error)
	// syncStream waits for one stream (resolved: see Resource.wait).
	// Only Sleep waits for the whole device (syncDevice).
	syncStream(s *cuda.Stream) error
	// For Sleep and Wake (sleep.go): the device's work, pinned host
	// memory, and synchronous copies between it and mapped memory.
	syncDevice() error
	hostAlloc(size uint64) ([]byte, error)
	hostFree(mem []byte) error
	copyDtoH(dst []byte, src cuda.DevicePtr) error
	copyHtoD(dst cuda.DevicePtr, src []byte) error
	// A stream of Wake's own, and copies ordered on it.
	newStream() (*cuda.Stream, error)
	closeStream(s *cuda.Stream) error
	copyHtoDAsync(dst cuda.DevicePtr, src []byte, s *cuda.Stream) error
	// peerCanAccess reports whether peer can map the device's memory.
	peerCanAccess(peer *cuda.Device) (bool, error)
}

// device is the real driver: the cuda package's calls on one device.
type device struct{ *cuda.Device }

func (d device) syncStream(s *cuda.Stream) error { return s.Sync() }

func (d device) peerCanAccess(peer *cuda.Device) (bool, error) { return peer.CanAccessPeer(d.Device) }

func (d device) syncDevice() error { return d.Sync() }

// The copies go through pinned memory the driver allocated (never Go
// memory), so handing its address over is safe.
func (d device) copyDtoH(dst []byte, src cuda.DevicePtr) error {
	return d.MemcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), src, uint64(len(dst)))
}

func (d device) copyHtoD(dst cuda.DevicePtr, src []byte) error {
	return d.MemcpyHtoD(dst, unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src)))
}

func (d device) newStream() (*cuda.Stream, error) { return d.NewStream() }

func (d device) closeStream(s *cuda.Stream) error { return s.Close() }

func (d device) copyHtoDAsync(dst cuda.DevicePtr, src []byte, s *cuda.Stream) error {
	return s.MemcpyHtoDAsync(dst, unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src)))
}

// leftovers are driver resources that a failed cleanup could not give
// back. They are kept, not forgotten: later operations and Reclaim retry
// them, so a transient driver failure leaks nothing for good, and nothing
// is released twice (each entry is dropped once its release succeeds).
type leftovers struct {
	maps    []span           // mapped ranges still to unmap
	handles []cuda.MemHandle // physical allocations still to release
	spans   []span           // address reservations still to free
}

func (l *leftovers) empty() bool {
	return len(l.maps) == 0 && len(l.handles) == 0 && len(l.spans) == 0
}

// reap gives back everything in l: unmaps first, then handles (the driver
// frees physical memory once its last mapping goes), then address ranges,
// which are freed only when nothing is left mapped (a range must be empty
// to be freed). What fails stays in l; the failures are joined.
func reap(drv driver, l *leftovers) error {
	var errs []error
	maps := l.maps[:0]
	for _, m := range l.maps {
		if err := drv.MemUnmap(m.ptr, m.size); err != nil {
			errs = append(errs, fmt.Errorf("unmapping %d bytes at %#x: %w", m.size, uint64(m.ptr), err))
			maps = append(maps, m)
		}
	}
	l.maps = maps
	handles := l.handles[:0]
	for _, h := range l.handles {
		if err := drv.MemRelease(h); err != nil {
			errs = append(errs, fmt.Errorf("releasing handle %#x: %w", uint64(h), err))
			handles = append(handles, h)
		}
	}
	l.handles = handles
	if len(l.maps) == 0 {
		spans := l.spans[:0]
		for _, s := range l.spans {
			if err := drv.MemAddressFree(s.ptr, s.size); err != nil {
				errs = append(errs, fmt.Errorf("freeing %d bytes of address space at %#x: %w", s.size, uint64(s.ptr), err))
				spans = append(spans, s)
			}
		}
		l.spans = spans
	} else if len(l.spans) > 0 {
		errs = append(errs, fmt.Errorf("%d address ranges wait for %d mappings to go", len(l.spans), len(l.maps)))
	}
	return errors.Join(errs...)
}

// pending holds a Resource's leftovers. Its lock is a leaf: taken under
// Resource.mu, never the other way round.
type pending struct {
	mu   sync.Mutex
	l    leftovers
	some atomic.Bool // l is not empty: lets the common case skip the lock
}

// keep records what a cleanup could not give back.
func (p *pending) keep(l *leftovers) {
	if l.empty() {
		return
	}
	p.mu.Lock()
	p.l.maps = append(p.l.maps, l.maps...)
	p.l.handles = append(p.l.handles, l.handles...)
	p.l.spans = append(p.l.spans, l.spans...)
	p.some.Store(true)
	p.mu.Unlock()
}

// retry reaps the recorded leftovers and keeps what fails again.
func (p *pending) retry(drv driver) error {
	if !p.some.Load() {
		return nil
	}
	p.mu.Lock()
	l := p.l
	p.l = leftovers{}
	p.some.Store(false)
	p.mu.Unlock()
	err := reap(drv, &l)
	p.keep(&l)
	return err
}

// txn records what one multi-step operation has acquired so far, so a
// failure can give all of it back and leave the resource and the
// allocation exactly as they were.
type txn struct {
	l leftovers
	// Room for a simple operation's steps, so recording them does not
	// allocate (see start).
	spans   [1]span
	handles [1]cuda.MemHandle
	maps    [1]span
}

// start points t's records at its own storage. The txn must not be
// copied afterwards.
func (t *txn) start() *txn {
	t.l = leftovers{spans: t.spans[:0], handles: t.handles[:0], maps: t.maps[:0]}
	return t
}

func (t *txn) reserved(p cuda.DevicePtr, size uint64) { t.l.spans = append(t.l.spans, span{p, size}) }
func (t *txn) created(h cuda.MemHandle)               { t.l.handles = append(t.l.handles, h) }
func (t *txn) mapped(p cuda.DevicePtr, size uint64)   { t.l.maps = append(t.l.maps, span{p, size}) }

// rollback gives back what the operation acquired and returns err joined
// with any failure to do so; what could not be given back is kept in
// r.left for later retries (so it is neither leaked nor freed twice).
func (r *Resource) rollback(t *txn, err error) error {
	if rerr := reap(r.drv, &t.l); rerr != nil {
		err = errors.Join(err, fmt.Errorf("undoing it: %w (kept for a retry)", rerr))
	}
	r.left.keep(&t.l)
	return err
}
