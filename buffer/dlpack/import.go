package dlpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
)

// MaxDims is the most dimensions Import accepts (NumPy's limit): a bound
// on what it reads through the tensor's shape and strides pointers.
const MaxDims = 64

// ImportOption sets what Import accepts.
type ImportOption func(*importConfig)

type importConfig struct {
	expect   *Device
	readOnly bool
}

// ExpectDevice makes Import refuse a tensor on any other device (type and
// index) with an error matching cuda.ErrInvalidArgument.
func ExpectDevice(d Device) ImportOption { return func(c *importConfig) { c.expect = &d } }

// AllowReadOnly accepts tensors flagged read-only (FlagReadOnly), and host
// tensors in read-only memory whatever their flags. A Buffer cannot
// refuse writes: the caller promises not to write through it. Without
// this option a tensor flagged read-only is refused with an error matching
// cuda.ErrNotSupported, and a kDLCPU tensor whose memory is not writable
// with one matching cuda.ErrInvalidArgument (its producer failed to flag
// it). With it, Import also skips reading the process's mappings, which
// only writability needs (see Import).
func AllowReadOnly() ImportOption { return func(c *importConfig) { c.readOnly = true } }

// Import takes a DLManagedTensorVersioned from a C library (p is its
// address) and returns a Buffer over the tensor's bytes: from Data plus
// ByteOffset, as many bytes as its shape and data type span. Close of the
// Buffer (or, if it is lost, the garbage-collection safety net) calls the
// producer's deleter, exactly once; CloseOn(s) first waits for s, so that
// work the caller queued on the memory is over before the producer gets
// it back. Close with no stream waits for nothing: synchronize first.
//
// The Buffer is owned in package buffer's sense (Close gives the memory
// back), through a resource of this package that cannot allocate; its
// accessibility follows the tensor's device type: CPU memory is host-only,
// CUDA memory device-only (of device ID), CUDAHost and CUDAManaged memory
// both.
//
// Import accepts dense tensors only: no strides (compact row-major), or
// strides that tile the elements without gaps in some order of the
// dimensions (row-major, column-major, any permutation); dimensions of
// size 1 may have any stride. It refuses, with an error matching
// cuda.ErrInvalidArgument: a null or misaligned p, negative dimensions,
// more than MaxDims of them, sizes that overflow, a null Data with a
// non-zero size, a zero Bits or Lanes, a range that wraps, an unknown
// device type, a negative CUDA device index, a device other than the one
// ExpectDevice names; CUDA memory the driver does not know (or knows on
// another device, or, for kDLCUDAHost and kDLCUDAManaged, knows as
// device-only memory the host cannot reach); kDLCPU memory that a load
// would fault on anywhere (unmapped holes, PROT_NONE guard pages, file
// pages past the end of their file) or, without AllowReadOnly, that is
// not writable; struct, shape and strides that cannot be read; and a
// deleter outside executable memory. Matching cuda.ErrNotSupported: a
// major version other than MajorVersion, a device type other than CPU,
// CUDA, CUDAHost and CUDAManaged, negative or gapped strides, a read-only
// tensor without AllowReadOnly, and a kDLCPU tensor whose writability
// cannot be learned (no /proc/self/maps) without AllowReadOnly.
//
// Nothing Import checks is read by a Go load: the struct, shape and
// strides are read through the kernel (process_vm_readv, or a pipe),
// which reports a bad address as an error instead of crashing. For kDLCPU
// memory the process's mappings (/proc/self/maps: tens of microseconds)
// must allow reads and, without AllowReadOnly, writes on every byte, and
// one byte of every page is read through a pipe, as a load would: about
// two system calls per 1024 pages, faulting in pages not resident. None
// of this stops a producer from unmapping the memory after Import.
//
// If Import fails, the tensor is still the caller's: its deleter has not
// been called (Delete calls it). Import never calls the deleter of a
// tensor it refused, even for a major version it cannot read as the
// DLPack header suggests: a tensor with garbage fields may have a garbage
// deleter too. A tensor of zero bytes with a null Data has no memory to
// cover: Import calls its deleter at once and returns an empty Buffer.
//
// Import works where Export does (linux/amd64, linux/arm64), and returns
// an error matching cuda.ErrNotSupported elsewhere.
func Import(p uintptr, opts ...ImportOption) (*buffer.Buffer, error) {
	return importTensor("dlpack.Import", p, true, opts)
}

// ImportUnversioned is Import for an unversioned DLManagedTensor (DLPack
// before 1.0): no version to check, and no flags.
func ImportUnversioned(p uintptr, opts ...ImportOption) (*buffer.Buffer, error) {
	return importTensor("dlpack.ImportUnversioned", p, false, opts)
}

// Delete calls the deleter of the DLManagedTensorVersioned at p (nothing
// if it has none): for a tensor Import refused, or one the caller does not
// want. Only the version, manager_ctx and deleter are read, which keep
// their places in every DLPack major version. A null p, a header that
// cannot be read, or a deleter outside executable memory (see Import) is
// an error matching cuda.ErrInvalidArgument, and nothing is called.
func Delete(p uintptr) error {
	const op = "dlpack.Delete"
	var hdr struct {
		Version    Version
		ManagerCtx uintptr
		Deleter    uintptr
	}
	if err := readHeader(op, p, unsafe.Pointer(&hdr), unsafe.Sizeof(hdr)); err != nil {
		return err
	}
	return callDeleter(op, p, hdr.Deleter)
}

// DeleteUnversioned is Delete for an unversioned DLManagedTensor.
func DeleteUnversioned(p uintptr) error {
	const op = "dlpack.DeleteUnversioned"
	var m ManagedTensor
	if err := readHeader(op, p, unsafe.Pointer(&m), unsafe.Sizeof(m)); err != nil {
		return err
	}
	return callDeleter(op, p, m.Deleter)
}

func callDeleter(op string, p, deleter uintptr) error {
	if deleter == 0 {
		return nil
	}
	d, err := deleterProc(op, p, deleter)
	if err != nil {
		return err
	}
	d.Call(p)
	return nil
}

// deleterProc checks what can be checked of the deleter of the tensor at
// p before it is called: that it lies in executable memory (from the
// process's mappings), or, where they cannot be read, at least in
// readable memory. Calling an address without execute permission would
// crash the process. Whether it is really a function taking the tensor
// stays the producer's word.
func deleterProc(op string, p, deleter uintptr) (loader.Proc, error) {
	switch err := mappingsAllow(deleter, 1, permExec); {
	case errors.Is(err, errNoMaps):
		if err := readMem(make([]byte, 1), deleter); err != nil {
			return loader.Proc{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "deleter at %#x is not mapped memory (%v) (tensor at %#x)", deleter, err, p)
		}
	case err != nil:
		return loader.Proc{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "deleter at %#x is not code: %v (tensor at %#x)", deleter, err, p)
	}
	return loader.ProcAt(deleter, "DLPack deleter"), nil
}

// readHeader copies n bytes of the struct at p into dst, through the
// kernel.
func readHeader(op string, p uintptr, dst unsafe.Pointer, n uintptr) error {
	if !supported {
		return unsupported(op)
	}
	switch {
	case p == 0:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "null tensor")
	case p%unsafe.Alignof(uintptr(0)) != 0:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor address %#x is not aligned to %d bytes", p, unsafe.Alignof(uintptr(0)))
	}
	if err := readMem(unsafe.Slice((*byte)(dst), n), p); err != nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x: %d bytes cannot be read (%v)", p, n, err)
	}
	return nil
}

func unsupported(op string) error {
	return cuda.Errorf(op, cuda.ErrNotSupported, "DLPack needs C callbacks without cgo and calls through the loader: linux/amd64 and linux/arm64 only, not %s/%s", runtime.GOOS, runtime.GOARCH)
}

func importTensor(op string, p uintptr, versioned bool, opts []ImportOption) (*buffer.Buffer, error) {
	var cfg importConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	var t Tensor
	var deleter, flags uint64
	if versioned {
		var v Version
		if err := readHeader(op, p, unsafe.Pointer(&v), unsafe.Sizeof(v)); err != nil {
			return nil, err
		}
		if v.Major != MajorVersion {
			return nil, cuda.Errorf(op, cuda.ErrNotSupported, "tensor at %#x has DLPack version %d.%d; this package reads major version %d (the tensor is still yours: Delete calls its deleter)", p, v.Major, v.Minor, MajorVersion)
		}
		var m ManagedTensorVersioned
		if err := readHeader(op, p, unsafe.Pointer(&m), unsafe.Sizeof(m)); err != nil {
			return nil, err
		}
		t, deleter, flags = m.Tensor, uint64(m.Deleter), m.Flags
		if flags&FlagReadOnly != 0 && !cfg.readOnly {
			return nil, cuda.Errorf(op, cuda.ErrNotSupported, "tensor at %#x is read-only, and a Buffer cannot refuse writes (import it with AllowReadOnly if you will not write it)", p)
		}
	} else {
		var m ManagedTensor
		if err := readHeader(op, p, unsafe.Pointer(&m), unsafe.Sizeof(m)); err != nil {
			return nil, err
		}
		t, deleter = m.Tensor, uint64(m.Deleter)
	}
	r := &tensorResource{tensor: p, device: t.Device}
	var err error
	if r.ptr, r.size, err = extent(op, p, &t, flags); err != nil {
		return nil, err
	}
	if err := checkDevice(op, p, t.Device, cfg.expect); err != nil {
		return nil, err
	}
	if err := checkMemory(op, p, t.Device, r.ptr, r.size, cfg.readOnly); err != nil {
		return nil, err
	}
	if deleter != 0 {
		if r.deleter, err = deleterProc(op, p, uintptr(deleter)); err != nil {
			return nil, err
		}
	}
	if r.ptr == 0 {
		// Empty, with no address: no memory for a Buffer to cover, and
		// buffer.Owned would never call Deallocate for address 0.
		r.release()
		return buffer.FromPointer(0, 0), nil
	}
	return buffer.Owned(cuda.DevicePtr(r.ptr), r.size, r, nil), nil
}

// extent works out the tensor's byte range: [Data+ByteOffset, +size).
func extent(op string, p uintptr, t *Tensor, flags uint64) (ptr uintptr, size uint64, err error) {
	bad := func(format string, args ...any) error {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x: "+format, append([]any{p}, args...)...)
	}
	if t.NDim < 0 || t.NDim > MaxDims {
		return 0, 0, bad("%d dimensions (0 to %d accepted)", t.NDim, MaxDims)
	}
	if t.DType.Bits == 0 || t.DType.Lanes == 0 {
		return 0, 0, bad("data type with %d bits and %d lanes", t.DType.Bits, t.DType.Lanes)
	}
	n := int(t.NDim)
	shape, err := readInt64s(t.Shape, n)
	if err != nil {
		return 0, 0, bad("shape at %#x: %v", t.Shape, err)
	}
	var strides []int64
	if t.Strides != 0 {
		if strides, err = readInt64s(t.Strides, n); err != nil {
			return 0, 0, bad("strides at %#x: %v", t.Strides, err)
		}
	}
	for i, d := range shape {
		if d < 0 {
			return 0, 0, bad("dimension %d is %d", i, d)
		}
	}
	numel := uint64(0)
	if !slices.Contains(shape, 0) { // else the product could overflow before the 0
		numel = 1
		for _, d := range shape {
			hi, lo := bits.Mul64(numel, uint64(d))
			if hi != 0 {
				return 0, 0, bad("shape %v overflows", shape)
			}
			numel = lo
		}
	}
	if strides != nil && numel > 1 {
		if err := dense(shape, strides); err != nil {
			return 0, 0, cuda.Errorf(op, cuda.ErrNotSupported, "tensor at %#x: shape %v, strides %v: %v (only dense tensors can be one Buffer)", p, shape, strides, err)
		}
	}
	// Whole bytes per element, or sub-byte ones padded to a byte each;
	// else packed bits, rounded up to a byte.
	elemBits := uint64(t.DType.Bits) * uint64(t.DType.Lanes)
	if elemBits%8 == 0 || flags&FlagIsSubbytePadded != 0 {
		hi, lo := bits.Mul64(numel, (elemBits+7)/8)
		if hi != 0 {
			return 0, 0, bad("%d elements of %d bytes overflow", numel, (elemBits+7)/8)
		}
		size = lo
	} else {
		hi, lo := bits.Mul64(numel, elemBits)
		if hi != 0 {
			return 0, 0, bad("%d elements of %d bits overflow", numel, elemBits)
		}
		size = lo/8 + min(lo%8, 1)
	}
	if t.Data == 0 {
		if size > 0 {
			return 0, 0, bad("null data with %d bytes", size)
		}
		return 0, 0, nil
	}
	start := uint64(t.Data) + t.ByteOffset
	if start < uint64(t.Data) || uint64(uintptr(start)) != start || start+size < start || uint64(uintptr(start+size)) != start+size {
		return 0, 0, bad("data %#x + byte offset %d + %d bytes wraps around the address space", t.Data, t.ByteOffset, size)
	}
	return uintptr(start), size, nil
}

// readInt64s reads n int64 values at addr through the kernel.
func readInt64s(addr uintptr, n int) ([]int64, error) {
	if n == 0 {
		return nil, nil
	}
	if addr == 0 {
		return nil, fmt.Errorf("null pointer for %d values", n)
	}
	if addr%unsafe.Alignof(int64(0)) != 0 {
		return nil, fmt.Errorf("not aligned")
	}
	raw := make([]byte, 8*n)
	if err := readMem(raw, addr); err != nil {
		return nil, fmt.Errorf("cannot be read (%v)", err)
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(binary.NativeEndian.Uint64(raw[8*i:]))
	}
	return out, nil
}

// dense reports why strides (in elements) do not tile shape without
// gaps or overlaps, or nil if they do. Dimensions of size 1 take no part;
// the rest, sorted by stride, must each step by the product of the sizes
// of those before.
func dense(shape, strides []int64) error {
	type dim struct{ size, stride int64 }
	var ds []dim
	for i := range shape {
		if shape[i] == 1 {
			continue
		}
		if strides[i] < 0 {
			return fmt.Errorf("negative stride %d", strides[i])
		}
		ds = append(ds, dim{shape[i], strides[i]})
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].stride < ds[j].stride })
	want := int64(1)
	for _, d := range ds {
		if d.stride != want {
			return fmt.Errorf("not contiguous (stride %d where %d would be dense)", d.stride, want)
		}
		want *= d.size // no overflow: the element count fit in 64 bits
	}
	return nil
}

// checkDevice checks the device type and index, and what ExpectDevice
// asked for.
func checkDevice(op string, p uintptr, d Device, expect *Device) error {
	switch d.Type {
	case CPU, CUDA, CUDAHost, CUDAManaged:
	default:
		if d.Type.known() {
			return cuda.Errorf(op, cuda.ErrNotSupported, "tensor at %#x is on %v: only kDLCPU, kDLCUDA, kDLCUDAHost and kDLCUDAManaged memory can be a Buffer", p, d)
		}
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x has device type %d, which DLPack does not define", p, int32(d.Type))
	}
	if d.ID < 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x is on %v: a negative device index", p, d)
	}
	if expect != nil && *expect != d {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x is on %v, not on %v as expected", p, d, *expect)
	}
	return nil
}

// maxRanges bounds the driver allocations one imported tensor may span
// (contiguous chunks of a virtual-memory mapping, each its own range).
const maxRanges = 1 << 16

// checkMemory checks, as far as can be done safely, that every byte of
// the tensor is memory of its device, usable as the Buffer will use it:
// host memory (kDLCPU) page by page (checkHost); CUDA memory range by
// range from the first byte, each a driver allocation without a gap (of
// device ID for kDLCUDA, host-reachable for kDLCUDAHost and
// kDLCUDAManaged). Checking only the two ends would let a tensor span
// unmapped memory between two allocations.
func checkMemory(op string, p uintptr, d Device, ptr uintptr, size uint64, readOnly bool) error {
	if size == 0 {
		return nil
	}
	last := ptr + uintptr(size-1)
	if d.Type == CPU {
		return checkHost(op, p, ptr, size, readOnly)
	}
	if d.Type == CUDA {
		if _, err := cuda.GetDevice(int(d.ID)); err != nil {
			return fmt.Errorf("%s: tensor at %#x is on %v: %w", op, p, d, err)
		}
	}
	a := ptr
	for range maxRanges {
		info, err := cuda.QueryPointer(cuda.DevicePtr(a))
		if err != nil {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x claims %v memory at %#x (%d bytes), which the driver does not know at %#x: %w", p, d, ptr, size, a, err)
		}
		if d.Type == CUDA && info.Type == cuda.MemoryTypeDevice && info.Device != int(d.ID) {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x claims memory of device %d at %#x, which the driver says belongs to device %d", p, d.ID, a, info.Device)
		}
		if d.Type != CUDA && info.Type != cuda.MemoryTypeHost && !info.Managed {
			// A host-accessible Buffer over device-only memory would
			// crash the first host read of it.
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x claims %v memory at %#x, which the driver says is device memory of device %d, not reachable from the host (a kDLCUDA tensor?)", p, d, a, info.Device)
		}
		end := uintptr(info.RangeBase) + uintptr(info.RangeSize)
		if info.RangeSize == 0 || uintptr(info.RangeBase) > a || end <= a {
			// The driver gave no usable range: fall back to the ends.
			if a == last {
				return nil
			}
			a = last
			continue
		}
		if end > last {
			return nil
		}
		a = end // the next byte must start another allocation
	}
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x: %d bytes at %#x span more than %d driver allocations", p, size, ptr, maxRanges)
}

// checkHost checks that a Go load from every byte of a host tensor
// [ptr, ptr+size) succeeds, and, unless readOnly, that a store does: a
// Buffer's reads and writes are plain loads and stores, and one that
// faults kills the process. Writability can only be learned from the
// process's mappings, which must then cover the range, readable and
// writable (where they cannot be read, the tensor is refused as
// ErrNotSupported). Then one byte of every page is read through the kernel
// (readablePages), which also finds file pages past the end of their
// file, which the mappings do not show.
func checkHost(op string, p, ptr uintptr, size uint64, readOnly bool) error {
	n := uintptr(size)
	unreadable := func(err error) error {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x: its %d bytes at %#x are not all readable host memory: %v%s", p, size, ptr, err, driverSays(ptr))
	}
	if !readOnly {
		switch err := mappingsAllow(ptr, n, permRead|permWrite); {
		case err == nil:
		case errors.Is(err, errNoMaps):
			return cuda.Errorf(op, cuda.ErrNotSupported, "tensor at %#x: cannot tell whether its %d bytes at %#x are writable: %v (import it with AllowReadOnly if you will not write it)", p, size, ptr, err)
		default:
			var me *mapError
			if errors.As(err, &me) && me.missing == permWrite {
				return cuda.Errorf(op, cuda.ErrInvalidArgument, "tensor at %#x is not flagged read-only, but %v, and a Buffer cannot refuse writes (import it with AllowReadOnly if you will not write it)", p, err)
			}
			return unreadable(err)
		}
	}
	if err := readablePages(ptr, n); err != nil {
		if readOnly {
			// The mappings name a hole or a guard page better than
			// EFAULT does, where they can be read.
			if merr := mappingsAllow(ptr, n, permRead); merr != nil && !errors.Is(merr, errNoMaps) {
				return unreadable(merr)
			}
		}
		return unreadable(err)
	}
	return nil
}

// driverSays is what the driver knows of host memory that failed the host
// checks, for the error: device memory under a kDLCPU label is a common
// producer mistake. Empty when the driver knows nothing (or is absent).
func driverSays(ptr uintptr) string {
	info, err := cuda.QueryPointer(cuda.DevicePtr(ptr))
	switch {
	case err != nil:
		return ""
	case info.Managed:
		return fmt.Sprintf(" (the driver knows %#x as managed memory)", ptr)
	case info.Type == cuda.MemoryTypeDevice:
		return fmt.Sprintf(" (the driver knows %#x as device memory of device %d: a kDLCUDA tensor?)", ptr, info.Device)
	case info.Type == cuda.MemoryTypeHost:
		return fmt.Sprintf(" (the driver knows %#x as pinned host memory)", ptr)
	}
	return fmt.Sprintf(" (the driver knows %#x as memory of type %d)", ptr, info.Type)
}

// tensorResource is the resource of an imported tensor's Buffer: its
// Deallocate calls the producer's deleter, once.
type tensorResource struct {
	tensor  uintptr // the DLManagedTensor(Versioned) the deleter gets
	deleter loader.Proc
	device  Device
	ptr     uintptr
	size    uint64
	done    atomic.Bool
}

func (r *tensorResource) release() {
	if r.done.CompareAndSwap(false, true) {
		r.deleter.Call(r.tensor)
	}
}

// AllocatePtr is not supported: the resource only gives one tensor back.
func (r *tensorResource) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0, nil, cuda.Errorf("dlpack tensor resource Allocate", cuda.ErrNotSupported, "an imported DLPack tensor's resource cannot allocate")
}

// Deallocate waits for s (if not nil), then calls the deleter; a second
// call does nothing.
func (r *tensorResource) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	const op = "dlpack tensor resource Deallocate"
	if uintptr(ptr) != r.ptr || size != r.size {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%#x (%d bytes) is not the tensor at %#x (%#x, %d bytes)", uint64(ptr), size, r.tensor, r.ptr, r.size)
	}
	if s != nil {
		if err := s.Sync(); err != nil {
			return fmt.Errorf("%s: waiting for the stream before the deleter of the tensor at %#x: %w", op, r.tensor, err)
		}
	}
	r.release()
	return nil
}

// DeviceAccessible: CUDA, pinned and managed memory.
func (r *tensorResource) DeviceAccessible() bool { return r.device.Type != CPU }

// HostAccessible: CPU, pinned and managed memory.
func (r *tensorResource) HostAccessible() bool { return r.device.Type != CUDA }

// DeviceID: the device of CUDA and managed memory, -1 for host memory.
func (r *tensorResource) DeviceID() int {
	if r.device.Type == CUDA || r.device.Type == CUDAManaged {
		return int(r.device.ID)
	}
	return -1
}
