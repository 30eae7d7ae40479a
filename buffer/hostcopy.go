package buffer

import (
	"fmt"
	"io"
	"math"
	"reflect"
	"runtime"
	"sync"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// CopyFromHost copies src, a slice of plain data, into dst, ordered on s
// (nil: dst's stream). The byte sizes must be equal (len(src) times the
// size of T); slice dst first to fill part of it. T must hold no Go
// pointers: numbers, bools, and arrays and structs of them (an error
// matching [cuda.ErrInvalidArgument] names the offending type otherwise).
//
// It returns once src may be reused. The transfer into dst may still be
// running then; work later submitted to s sees the data. One exception, as
// with cuMemcpyHtoDAsync: when src is itself page-locked memory (for
// example the [Buffer.Bytes] of a pinned buffer) the copy is fully
// asynchronous, so src must stay unchanged until s reaches this point.
// Large copies from ordinary (pageable) Go memory are staged through pinned
// memory; see the package documentation.
func CopyFromHost[T any](dst *Buffer, src []T, s *cuda.Stream) error {
	return copyHost("CopyFromHost", dst, bytesOf(src), reflect.TypeFor[T](), s, toBuffer)
}

// CopyToHost copies src into dst, a slice of plain data, ordered on s (nil:
// src's stream), and returns once the data is in dst: it waits for the
// work submitted to s before it. The byte sizes must be equal, and T must
// hold no Go pointers, as for [CopyFromHost].
func CopyToHost[T any](dst []T, src *Buffer, s *cuda.Stream) error {
	return copyHost("CopyToHost", src, bytesOf(dst), reflect.TypeFor[T](), s, fromBuffer)
}

// copyHost is CopyFromHost (into b) and CopyToHost: p, the bytes of a
// slice of t, must be b's size.
func copyHost(op string, b *Buffer, p []byte, t reflect.Type, s *cuda.Stream, into bool) error {
	if err := checkPlain(op, t); err != nil {
		return err
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	if uint64(len(p)) != b.size {
		src, dst := uint64(len(p)), b.size
		if !into {
			src, dst = dst, src
		}
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "buffer sizes mismatch between src and dst (sizes are: src=%d, dst=%d)", src, dst)
	}
	return b.hostCopy(op, ptr, p, s, into, false)
}

// ReadAt reads len(p) bytes at offset off of the buffer into p, as
// [io.ReaderAt] specifies: fewer bytes only at the end of the buffer, then
// with io.EOF. It is synchronous, ordered on the buffer's stream (see the
// package documentation): it returns once p holds the data.
func (b *Buffer) ReadAt(p []byte, off int64) (int, error) {
	const op = "Buffer.ReadAt"
	ptr, err := b.acquire(op)
	if err != nil {
		return 0, err
	}
	defer b.release()
	if off < 0 {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "negative offset %d", off)
	}
	if uint64(off) >= b.size {
		return 0, io.EOF
	}
	n := uint64(len(p))
	if rest := b.size - uint64(off); n > rest {
		n = rest
	}
	if err := b.hostCopy(op, ptr+cuda.DevicePtr(off), p[:n], nil, fromBuffer, true); err != nil {
		return 0, err
	}
	if n < uint64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// WriteAt writes p into the buffer at offset off, as [io.WriterAt]
// specifies. A write that would not fit writes nothing and returns an
// error matching [cuda.ErrInvalidArgument]; buffers do not grow. It is
// synchronous, ordered on the buffer's stream: it returns once the data is
// in the buffer.
func (b *Buffer) WriteAt(p []byte, off int64) (int, error) {
	const op = "Buffer.WriteAt"
	ptr, err := b.acquire(op)
	if err != nil {
		return 0, err
	}
	defer b.release()
	if off < 0 {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "negative offset %d", off)
	}
	if n := uint64(len(p)); uint64(off) > b.size || n > b.size-uint64(off) {
		return 0, cuda.Errorf(op, cuda.ErrInvalidArgument, "writing %d bytes at offset %d overruns a %d-byte buffer", n, off, b.size)
	}
	if err := b.hostCopy(op, ptr+cuda.DevicePtr(off), p, nil, toBuffer, true); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Directions of hostCopy.
const (
	toBuffer   = true
	fromBuffer = false
)

// hostCopy copies between the host bytes p and the len(p) bytes at ptr
// (inside b, acquired) on s, into the buffer or out of it. A copy out
// returns once the data is in p; one into it once p may be reused, and
// with wait once the data is in the buffer.
func (b *Buffer) hostCopy(op string, ptr cuda.DevicePtr, p []byte, s *cuda.Stream, into, wait bool) error {
	if len(p) == 0 {
		return nil
	}
	n := uint64(len(p))
	// Memory no device can reach needs no stream; one given is still
	// drained first, so the copy is ordered after the work on it.
	hostOnly := b.props().hostOnly()
	var err error
	if hostOnly {
		err = checkStream(op, s)
	} else {
		s, err = b.streamFor(op, s)
	}
	if err != nil {
		return err
	}
	if err := refuseCapture(op, s); err != nil {
		return err
	}
	if hostOnly || b.pinnedHost() {
		// Host to host: drain the stream, then move the bytes on the CPU.
		if s != nil {
			if err := s.Sync(); err != nil {
				return err
			}
		}
		h, err := hostSlice(op, ptr, n)
		if err != nil {
			return err
		}
		if into {
			parallelCopy(h, p)
		} else {
			parallelCopy(p, h)
		}
		return nil
	}
	if stageable(into, n, p) && !stagingOff.Load() {
		var done bool
		if into {
			done, err = stagedHtoD(&stage, streamQueue{s}, s.Device(), ptr, p)
		} else {
			done, err = stagedDtoH(&stage, streamQueue{s}, s.Device(), p, ptr)
		}
		if done {
			if err == nil && into && wait {
				err = s.Sync()
			}
			return err
		}
	}
	if into {
		err = s.MemcpyHtoDAsync(ptr, unsafe.Pointer(unsafe.SliceData(p)), n)
	} else {
		// Pageable p: the copy finishes before the call returns.
		// Page-locked p: it may not have, so it is waited for below.
		err = s.MemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(p)), ptr, n)
		wait = true
	}
	if err == nil && wait {
		err = s.Sync()
	}
	runtime.KeepAlive(p) // the caller's slice, until the copy is known done
	return err
}

// stageable reports whether a copy of n bytes between a device and p is
// large enough to stage: into a device from stageMinBytes; out of one
// from stageOutMinBytes, or from stageFreshMinBytes where p is fresh.
func stageable(into bool, n uint64, p []byte) bool {
	if into {
		return n >= uint64(stageMinBytes.Load())
	}
	return n >= uint64(stageOutMinBytes.Load()) || n >= uint64(stageFreshMinBytes.Load()) && fresh(p)
}

// refuseCapture refuses a copy between Go memory and a buffer on a
// capturing stream: it makes the host wait for the stream, which a
// capture cannot hold. Buffer-to-buffer copies and fills are captured as
// graph nodes.
func refuseCapture(op string, s *cuda.Stream) error {
	if err := s.RefuseCapture(op); err != nil {
		return fmt.Errorf("%w (copies to and from Go memory wait for the host; inside a capture, copy Buffer to Buffer, from a pinned host buffer)", err)
	}
	return nil
}

// bytesOf views a slice of plain data as bytes.
func bytesOf[T any](s []T) []byte {
	var zero T
	n := uintptr(len(s)) * unsafe.Sizeof(zero)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), n)
}

// hostSlice views n bytes of host-accessible memory at p. The address
// comes from the driver or a resource, not from Go: it is converted
// through memory rather than with unsafe.Pointer(uintptr), which vet
// rightly flags for Go pointers. A range no Go slice can describe is an
// error matching cuda.ErrInvalidArgument rather than unsafe.Slice's panic.
func hostSlice(op string, p cuda.DevicePtr, n uint64) ([]byte, error) {
	addr := uintptr(p)
	switch {
	case n == 0:
		return []byte{}, nil
	case p == 0:
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "host memory at address 0 (%d bytes)", n)
	case uint64(addr) != uint64(p) || n > maxSlice || n > uint64(-addr):
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "host memory at %#x (%d bytes) does not fit in this process's address space", uint64(p), n)
	}
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), n), nil
}

// plainTypes caches checkPlain's verdict per type: the offending path, or
// "" for plain data.
var plainTypes sync.Map // reflect.Type -> string

// checkPlain rejects element types that hold Go pointers: their bytes mean
// nothing on a device, and writing them back from a device would hide
// pointers from the garbage collector.
func checkPlain(op string, t reflect.Type) error {
	v, ok := plainTypes.Load(t)
	if !ok {
		v, _ = plainTypes.LoadOrStore(t, pointerPath(t, t.String()))
	}
	if path := v.(string); path != "" {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "element type %v holds Go pointers (%s): only plain data (numbers, bools, and arrays and structs of them) can be copied to or from a buffer", t, path)
	}
	return nil
}

// pointerPath returns where t holds a pointer, as "path (kind)", or "".
func pointerPath(t reflect.Type, path string) string {
	switch t.Kind() {
	case reflect.Pointer, reflect.UnsafePointer, reflect.Slice, reflect.Map, reflect.String,
		reflect.Interface, reflect.Chan, reflect.Func:
		return fmt.Sprintf("%s is a %v", path, t.Kind())
	case reflect.Array:
		if t.Len() == 0 {
			return ""
		}
		return pointerPath(t.Elem(), path+"[i]")
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if p := pointerPath(f.Type, path+"."+f.Name); p != "" {
				return p
			}
		}
	}
	return ""
}

// maxSlice is the largest length a Go slice may have on this platform.
const maxSlice = math.MaxInt
