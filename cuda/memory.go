package cuda

import (
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// This file holds the driver's allocation, copy and fill calls, typed and
// checked. They manage no lifetimes: package buffer and package resource
// build owned, closable memory on top of them.

// call makes the driver call proc(d.drv) with args in d's context (op
// names a failure to get it).
func (d *Device) call(op string, proc func(*driver) *loader.Proc, args ...uintptr) error {
	ctx, err := d.contextFor(op)
	if err != nil {
		return err
	}
	p := proc(d.drv)
	return result(p, p.CallCtx(ctx, args...))
}

// enqueue makes the driver call proc(s.dev.drv) with args and then s's
// handle, inside begin/end on s named op.
func (s *Stream) enqueue(op string, proc func(*driver) *loader.Proc, args ...uintptr) error {
	ctx, h, err := s.begin(op)
	if err != nil {
		return err
	}
	p := proc(s.dev.drv)
	r := p.CallCtx(ctx, append(args, h)...)
	s.end()
	return result(p, r)
}

// MemAlloc allocates size bytes of device memory synchronously (cuMemAlloc).
func (d *Device) MemAlloc(size uint64) (DevicePtr, error) {
	ctx, err := d.contextFor("Device.MemAlloc")
	if err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, Errorf("cuMemAlloc", ErrInvalidArgument, "zero size")
	}
	var p DevicePtr
	if r := d.drv.MemAlloc.CallCtx(ctx, uintptr(unsafe.Pointer(&p)), uintptr(size)); !ok(r) {
		return 0, sizeErr(fail(&d.drv.MemAlloc, r), size)
	}
	return p, nil
}

// MemFree frees memory from MemAlloc or MemAllocManaged (cuMemFree).
func (d *Device) MemFree(p DevicePtr) error {
	return d.call("Device.MemFree", func(d *driver) *loader.Proc { return &d.MemFree }, uintptr(p))
}

// MemAllocManaged allocates size bytes of managed (unified) memory,
// accessible from the host and every device (cuMemAllocManaged).
func (d *Device) MemAllocManaged(size uint64, flags MemAttachFlags) (DevicePtr, error) {
	ctx, err := d.contextFor("Device.MemAllocManaged")
	if err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, Errorf("cuMemAllocManaged", ErrInvalidArgument, "zero size")
	}
	var p DevicePtr
	if r := d.drv.MemAllocManaged.CallCtx(ctx, uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(flags)); !ok(r) {
		return 0, sizeErr(fail(&d.drv.MemAllocManaged, r), size)
	}
	return p, nil
}

// MemHostAlloc allocates size bytes of page-locked host memory
// (cuMemHostAlloc). With MemHostAllocPortable it is pinned for every
// context; the returned pointer is also a valid device address under
// unified addressing.
func (d *Device) MemHostAlloc(size uint64, flags MemHostAllocFlags) (unsafe.Pointer, error) {
	ctx, err := d.contextFor("Device.MemHostAlloc")
	if err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, Errorf("cuMemHostAlloc", ErrInvalidArgument, "zero size")
	}
	var p unsafe.Pointer
	if r := d.drv.MemHostAlloc.CallCtx(ctx, uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(flags)); !ok(r) {
		return nil, sizeErr(fail(&d.drv.MemHostAlloc, r), size)
	}
	return p, nil
}

// MemFreeHost frees memory from MemHostAlloc (cuMemFreeHost).
func (d *Device) MemFreeHost(p unsafe.Pointer) error {
	return d.call("Device.MemFreeHost", func(d *driver) *loader.Proc { return &d.MemFreeHost }, uintptr(p))
}

// MemHostRegister page-locks existing host memory (cuMemHostRegister). The
// memory must stay allocated and unmoved until MemHostUnregister: use it
// only on memory not managed by the Go garbage collector (or pinned for
// the whole time).
func (d *Device) MemHostRegister(p unsafe.Pointer, size uint64, flags MemHostRegisterFlags) error {
	ctx, err := d.contextFor("Device.MemHostRegister")
	if err != nil {
		return err
	}
	if p == nil && size > 0 {
		return Errorf("cuMemHostRegister", ErrInvalidArgument, "nil host pointer for %d bytes", size)
	}
	if err := checkRange("cuMemHostRegister", "host", uint64(uintptr(p)), size); err != nil {
		return err
	}
	return result(&d.drv.MemHostRegister, d.drv.MemHostRegister.CallCtx(ctx, uintptr(p), uintptr(size), uintptr(flags)))
}

// MemHostUnregister undoes MemHostRegister.
func (d *Device) MemHostUnregister(p unsafe.Pointer) error {
	return d.call("Device.MemHostUnregister", func(d *driver) *loader.Proc { return &d.MemHostUnregister }, uintptr(p))
}

// MemAdvise gives the driver a usage hint for managed memory
// (cuMemAdvise, CUDA 12.2 ABI).
func (d *Device) MemAdvise(p DevicePtr, size uint64, advice MemAdvice, loc MemLocation) error {
	ctx, err := d.contextFor("Device.MemAdvise")
	if err != nil {
		return err
	}
	if err := checkRange("cuMemAdvise", "managed", uint64(p), size); err != nil {
		return err
	}
	return result(&d.drv.MemAdvise, d.drv.MemAdvise.CallCtx(ctx, uintptr(p), uintptr(size), uintptr(advice), uintptr(loc.Pack())))
}

// MemcpyHtoD copies size bytes from host memory to the device synchronously
// (cuMemcpyHtoD). From pageable memory the driver stages the copy itself.
// It runs on the legacy default stream: while a blocking stream of the
// device's context captures, it is refused with an error matching
// ErrCapturing, as DefaultStream().MemcpyHtoDAsync is.
func (d *Device) MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, size uint64) error {
	ctx, err := d.contextFor("Device.MemcpyHtoD")
	if err != nil {
		return err
	}
	if src == nil && size > 0 {
		return Errorf("cuMemcpyHtoD", ErrInvalidArgument, "nil host pointer for %d bytes", size)
	}
	if err := checkCopy("cuMemcpyHtoD", uint64(dst), uint64(uintptr(src)), size); err != nil {
		return err
	}
	if err := d.refuseLegacy("Device.MemcpyHtoD"); err != nil {
		return err
	}
	defer d.exitLegacy()
	return result(&d.drv.MemcpyHtoD, d.drv.MemcpyHtoD.CallCtx(ctx, uintptr(dst), uintptr(src), uintptr(size)))
}

// MemcpyDtoH copies size bytes from the device to host memory
// synchronously (cuMemcpyDtoH), on the legacy default stream: refused
// while a blocking stream captures, as MemcpyHtoD is.
func (d *Device) MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, size uint64) error {
	ctx, err := d.contextFor("Device.MemcpyDtoH")
	if err != nil {
		return err
	}
	if dst == nil && size > 0 {
		return Errorf("cuMemcpyDtoH", ErrInvalidArgument, "nil host pointer for %d bytes", size)
	}
	if err := checkCopy("cuMemcpyDtoH", uint64(uintptr(dst)), uint64(src), size); err != nil {
		return err
	}
	if err := d.refuseLegacy("Device.MemcpyDtoH"); err != nil {
		return err
	}
	defer d.exitLegacy()
	return result(&d.drv.MemcpyDtoH, d.drv.MemcpyDtoH.CallCtx(ctx, uintptr(dst), uintptr(src), uintptr(size)))
}

// MemcpyAsync copies size bytes between any two addresses the driver knows
// (device, pinned host or managed; cuMemcpyAsync infers the direction),
// ordered on s.
func (s *Stream) MemcpyAsync(dst, src DevicePtr, size uint64) error {
	if err := checkCopy("cuMemcpyAsync", uint64(dst), uint64(src), size); err != nil {
		return err
	}
	return s.enqueue("cuMemcpyAsync", func(d *driver) *loader.Proc { return &d.MemcpyAsync }, uintptr(dst), uintptr(src), uintptr(size))
}

// MemcpyHtoDAsync copies size bytes from host memory at src to dst, ordered
// on s. Pinned src makes it asynchronous; pageable src is staged by the
// driver and returns once src may be reused.
func (s *Stream) MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, size uint64) error {
	if src == nil && size > 0 {
		return Errorf("cuMemcpyHtoDAsync", ErrInvalidArgument, "nil host pointer for %d bytes", size)
	}
	if err := checkCopy("cuMemcpyHtoDAsync", uint64(dst), uint64(uintptr(src)), size); err != nil {
		return err
	}
	return s.enqueue("cuMemcpyHtoDAsync", func(d *driver) *loader.Proc { return &d.MemcpyHtoDAsync }, uintptr(dst), uintptr(src), uintptr(size))
}

// MemcpyDtoHAsync copies size bytes from src to host memory at dst, ordered
// on s. With pageable dst the copy has finished when it returns; with
// pinned dst, synchronize s before reading dst.
func (s *Stream) MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, size uint64) error {
	if dst == nil && size > 0 {
		return Errorf("cuMemcpyDtoHAsync", ErrInvalidArgument, "nil host pointer for %d bytes", size)
	}
	if err := checkCopy("cuMemcpyDtoHAsync", uint64(uintptr(dst)), uint64(src), size); err != nil {
		return err
	}
	return s.enqueue("cuMemcpyDtoHAsync", func(d *driver) *loader.Proc { return &d.MemcpyDtoHAsync }, uintptr(dst), uintptr(src), uintptr(size))
}

// MemcpyPeerAsync copies size bytes from src on srcDev to dst on dstDev,
// ordered on s; it works with or without peer access enabled.
func (s *Stream) MemcpyPeerAsync(dst DevicePtr, dstDev *Device, src DevicePtr, srcDev *Device, size uint64) error {
	if err := checkCopy("cuMemcpyPeerAsync", uint64(dst), uint64(src), size); err != nil {
		return err
	}
	ctx, h, err := s.begin("cuMemcpyPeerAsync")
	if err != nil {
		return err
	}
	defer s.end()
	if !dstDev.valid() || !srcDev.valid() {
		return Errorf("cuMemcpyPeerAsync", ErrInvalidArgument, "nil or zero device (destination %v, source %v)", dstDev, srcDev)
	}
	dctx, err := dstDev.contextFor("Stream.MemcpyPeerAsync")
	if err != nil {
		return err
	}
	sctx, err := srcDev.contextFor("Stream.MemcpyPeerAsync")
	if err != nil {
		return err
	}
	return result(&s.dev.drv.MemcpyPeerAsync, s.dev.drv.MemcpyPeerAsync.CallCtx(ctx, uintptr(dst), dctx, uintptr(src), sctx, uintptr(size), h))
}

// MemsetD8Async sets n bytes at p to v, ordered on s.
func (s *Stream) MemsetD8Async(p DevicePtr, v uint8, n uint64) error {
	return s.memset(1, p, uintptr(v), n)
}

// MemsetD16Async sets n 16-bit words at p (2-byte aligned) to v.
func (s *Stream) MemsetD16Async(p DevicePtr, v uint16, n uint64) error {
	return s.memset(2, p, uintptr(v), n)
}

// MemsetD32Async sets n 32-bit words at p (4-byte aligned) to v.
func (s *Stream) MemsetD32Async(p DevicePtr, v uint32, n uint64) error {
	return s.memset(4, p, uintptr(v), n)
}

// memset is cuMemsetD8Async, cuMemsetD16Async or cuMemsetD32Async by the
// word's width in bytes.
func (s *Stream) memset(width uint64, p DevicePtr, v uintptr, n uint64) error {
	op := [...]string{1: "cuMemsetD8Async", 2: "cuMemsetD16Async", 4: "cuMemsetD32Async"}[width]
	if err := checkFill(op, uint64(p), n, width); err != nil {
		return err
	}
	return s.enqueue(op, func(d *driver) *loader.Proc {
		return [...]*loader.Proc{1: &d.MemsetD8Async, 2: &d.MemsetD16Async, 4: &d.MemsetD32Async}[width]
	}, uintptr(p), v, uintptr(n))
}

// MemPrefetchAsync migrates managed memory toward loc, ordered on s
// (cuMemPrefetchAsync, CUDA 12.2 ABI).
func (s *Stream) MemPrefetchAsync(p DevicePtr, size uint64, loc MemLocation) error {
	if err := checkRange("cuMemPrefetchAsync", "managed", uint64(p), size); err != nil {
		return err
	}
	return s.enqueue("cuMemPrefetchAsync", func(d *driver) *loader.Proc { return &d.MemPrefetchAsync }, uintptr(p), uintptr(size), uintptr(loc.Pack()), 0)
}

// MemAllocAsync allocates size bytes from the device's current pool,
// ordered on s (cuMemAllocAsync).
func (s *Stream) MemAllocAsync(size uint64) (DevicePtr, error) {
	if size == 0 {
		return 0, Errorf("cuMemAllocAsync", ErrInvalidArgument, "zero size")
	}
	ctx, h, err := s.begin("cuMemAllocAsync")
	if err != nil {
		return 0, err
	}
	var p DevicePtr
	r := s.dev.drv.MemAllocAsync.CallCtx(ctx, uintptr(unsafe.Pointer(&p)), uintptr(size), h)
	s.end()
	if !ok(r) {
		return 0, sizeErr(fail(&s.dev.drv.MemAllocAsync, r), size)
	}
	return p, nil
}

// MemAllocFromPoolAsync allocates size bytes from pool, ordered on s
// (cuMemAllocFromPoolAsync). The memory may be used on s at once, and on
// other streams after synchronizing with s.
func (s *Stream) MemAllocFromPoolAsync(pool MemPool, size uint64) (DevicePtr, error) {
	ctx, h, err := s.begin("cuMemAllocFromPoolAsync")
	if err != nil {
		return 0, err
	}
	// A zero pool would reach the driver as a NULL handle.
	if pool.IsZero() || size == 0 {
		s.end()
		return 0, Errorf("cuMemAllocFromPoolAsync", ErrInvalidArgument, "zero memory pool or zero size (%d bytes)", size)
	}
	var p DevicePtr
	r := s.dev.drv.MemAllocFromPoolAsync.CallCtx(ctx, uintptr(unsafe.Pointer(&p)), uintptr(size), pool.handle, h)
	s.end()
	if !ok(r) {
		return 0, sizeErr(fail(&s.dev.drv.MemAllocFromPoolAsync, r), size)
	}
	return p, nil
}

// MemFreeAsync returns stream-ordered memory to its pool once the work
// already on s has finished (cuMemFreeAsync).
func (s *Stream) MemFreeAsync(p DevicePtr) error {
	return s.enqueue("cuMemFreeAsync", func(d *driver) *loader.Proc { return &d.MemFreeAsync }, uintptr(p))
}

// PointerInfo describes an address the driver knows.
type PointerInfo struct {
	Type      MemoryType // device, host or array memory
	Device    int        // ordinal of the device the memory belongs to
	Managed   bool       // managed (unified) memory
	RangeBase DevicePtr  // start of the allocation that contains the address
	RangeSize uint64     // size of that allocation
	Pool      uintptr    // the memory pool it came from, or 0
}

// QueryPointer asks the driver what p is (cuPointerGetAttribute). An address
// the driver does not know returns an error matching ErrorInvalidValue.
func QueryPointer(p DevicePtr) (PointerInfo, error) {
	ds, err := devices()
	if err != nil {
		return PointerInfo{}, err
	}
	if len(ds) == 0 {
		return PointerInfo{}, Errorf("QueryPointer", ErrNotSupported, "no CUDA devices")
	}
	d := ds[0]
	ctx, err := d.contextFor("QueryPointer")
	if err != nil {
		return PointerInfo{}, err
	}
	var info PointerInfo
	var mt, ord, managed int32
	pg := &d.drv.PointerGetAttribute
	attrs := []struct {
		dst  unsafe.Pointer
		attr pointerAttr
	}{
		{unsafe.Pointer(&mt), pointerAttrMemoryType},
		{unsafe.Pointer(&ord), pointerAttrDeviceOrdinal},
		{unsafe.Pointer(&managed), pointerAttrIsManaged},
		{unsafe.Pointer(&info.RangeBase), pointerAttrRangeStartAddr},
		{unsafe.Pointer(&info.RangeSize), pointerAttrRangeSize},
		{unsafe.Pointer(&info.Pool), pointerAttrMemPoolHandle},
	}
	for _, a := range attrs {
		if r := pg.CallCtx(ctx, uintptr(a.dst), uintptr(a.attr), uintptr(p)); !ok(r) {
			if a.attr == pointerAttrMemPoolHandle {
				continue // not pool memory
			}
			return PointerInfo{}, fail(pg, r)
		}
	}
	info.Type, info.Device, info.Managed = MemoryType(mt), int(ord), managed != 0
	return info, nil
}

// sizeErr adds the requested size to an allocation error.
func sizeErr(err error, size uint64) error {
	if oe, isOp := err.(*OpError); isOp {
		return &OpError{Op: oe.Op, Err: &sizedError{size: size, err: oe.Err}}
	}
	return err
}

type sizedError struct {
	size uint64
	err  error
}

func (e *sizedError) Error() string { return e.err.Error() + " (" + formatSize(e.size) + " requested)" }
func (e *sizedError) Unwrap() error { return e.err }

// checkRange refuses a range of size bytes at p that wraps past 2^64: no
// memory has one, and a driver given it may read or write wherever the
// sum lands (an unknown address counts as pageable host memory under
// unified addressing). what names the kind of memory in the message.
func checkRange(op, what string, p, size uint64) error {
	if p+size < p {
		return Errorf(op, ErrInvalidArgument, "%s range %#x + %d bytes wraps past 2^64", what, p, size)
	}
	return nil
}

// checkCopy applies checkRange to both ends of a copy.
func checkCopy(op string, dst, src, size uint64) error {
	if err := checkRange(op, "destination", dst, size); err != nil {
		return err
	}
	return checkRange(op, "source", src, size)
}

// checkFill refuses a fill of n words of width bytes whose byte count
// overflows, or whose range wraps past 2^64.
func checkFill(op string, p, n, width uint64) error {
	if n > ^uint64(0)/width {
		return Errorf(op, ErrInvalidArgument, "%d words of %d bytes overflow 2^64 bytes", n, width)
	}
	return checkRange(op, "destination", p, n*width)
}
