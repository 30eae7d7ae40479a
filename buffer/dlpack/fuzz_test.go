//go:build linux

package dlpack_test

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
)

// The fuzz region: memory a hostile tensor can point into, with a page of
// each kind Import must tell apart. Pages 0 and 3 are read-write, page 1
// is PROT_NONE (a guard page), page 2 read-only, and page 4 a page of a
// file mapping past the end of its file (a load raises SIGBUS).
var region struct {
	once sync.Once
	base uintptr
	page int
	err  error
}

const regionPages = 5

// pageKind is what a Buffer may do with region page i: 2 read and write,
// 1 read only, 0 nothing.
func pageKind(i int) int {
	switch i {
	case 0, 3:
		return 2
	case 2:
		return 1
	}
	return 0
}

func fuzzRegion() (base uintptr, page int, err error) {
	region.once.Do(func() {
		page = syscall.Getpagesize()
		mem, err := syscall.Mmap(-1, 0, regionPages*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			region.err = err
			return
		}
		base := uintptr(unsafe.Pointer(&mem[0]))
		f, err := os.CreateTemp("", "dlpack-fuzz")
		if err != nil {
			region.err = err
			return
		}
		defer os.Remove(f.Name())
		defer f.Close()
		if err := f.Truncate(int64(page)); err != nil {
			region.err = err
			return
		}
		// Page 4: the file's second page, past its one-page end.
		_, _, e := syscall.Syscall6(syscall.SYS_MMAP, base+4*uintptr(page), uintptr(page), syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_SHARED|syscall.MAP_FIXED, f.Fd(), uintptr(page))
		if e == 0 {
			_, _, e = syscall.Syscall(syscall.SYS_MPROTECT, base+uintptr(page), uintptr(page), syscall.PROT_NONE)
		}
		if e == 0 {
			_, _, e = syscall.Syscall(syscall.SYS_MPROTECT, base+2*uintptr(page), uintptr(page), syscall.PROT_READ)
		}
		if e != 0 {
			region.err = e
			return
		}
		region.base, region.page = base, page
	})
	return region.base, region.page, region.err
}

// FuzzImport fills a versioned tensor's fields (and its shape and strides
// arrays) from the input and imports it: garbage gives an error or a
// Buffer over memory the Buffer can use, never a crash. ptrs picks where
// the pointers go: bit 0 any byte offset, bit 1 strides, bit 2 a garbage
// shape pointer, bit 3 data at the offset itself, bit 4 data into the fuzz
// region (guard, read-only and past-end-of-file pages), bit 5 the shape
// into the region, bit 6 a deleter into memory that is not code, bit 7
// AllowReadOnly. A deleter is never code, so Import must refuse every
// tensor that has one, and nothing the fuzzer writes is ever called.
func FuzzImport(f *testing.F) {
	needSupported(f)
	f.Add(uint32(1), int32(1), int32(0), int32(1), uint8(1), uint8(8), uint16(1), uint64(0), uint64(0), uint8(0), []byte{16, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint32(1), int32(2), int32(0), int32(2), uint8(2), uint8(32), uint16(1), uint64(8), uint64(1), uint8(3), make([]byte, 32))
	f.Add(uint32(2), int32(13), int32(-1), int32(-3), uint8(0), uint8(0), uint16(0), ^uint64(0), uint64(7), uint8(255), []byte{0xff})
	page := uint64(syscall.Getpagesize())
	le := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	for _, s := range []struct {
		offset uint64
		ptrs   uint8
		size   uint64
	}{
		{0, 16, page},              // page 0: usable
		{0, 16, 2 * page},          // into the guard page
		{page + 8, 16, 16},         // inside the guard page
		{2 * page, 16, page},       // the read-only page
		{2 * page, 16 | 128, page}, // the read-only page, AllowReadOnly
		{3 * page, 16, 2 * page},   // into the page past the file's end
		{4 * page, 16 | 128, 8},    // inside it
		{page, 32, 8},              // the shape in the guard page
		{0, 64, 16},                // a deleter in data memory
		{1, 64, 16},                // a deleter in the guard page
		{2, 64 | 128, 16},          // a deleter in the tensor itself
	} {
		f.Add(uint32(1), int32(1), int32(0), int32(1), uint8(1), uint8(8), uint16(1), s.offset, uint64(0), s.ptrs, le(s.size))
	}
	f.Fuzz(func(t *testing.T, major uint32, devType, devID, ndim int32, code, bits uint8, lanes uint16, offset, flags uint64, ptrs uint8, dims []byte) {
		base, page, err := fuzzRegion()
		if err != nil {
			t.Fatalf("the fuzz region: %v", err)
		}
		h := newHostile()
		var arr [2 * dlpack.MaxDims]int64
		for i := 0; i < len(arr) && 8*i+8 <= len(dims); i++ {
			arr[i] = int64(binary.LittleEndian.Uint64(dims[8*i:]))
		}
		m := &h.m
		m.Version.Major = major
		m.Flags = flags
		m.Tensor.Device = dlpack.Device{Type: dlpack.DeviceType(devType), ID: devID}
		m.Tensor.NDim = ndim
		m.Tensor.DType = dlpack.DataType{Code: dlpack.DataTypeCode(code), Bits: bits, Lanes: lanes}
		m.Tensor.ByteOffset = offset % 64 // within the hostile's bytes, mostly
		if ptrs&1 != 0 {
			m.Tensor.ByteOffset = offset // anywhere
		}
		m.Tensor.Shape = addr(&arr[0])
		if ptrs&2 != 0 {
			m.Tensor.Strides = addr(&arr[dlpack.MaxDims])
		}
		if ptrs&4 != 0 {
			m.Tensor.Shape = uintptr(offset) // a garbage pointer
		}
		if ptrs&8 != 0 {
			m.Tensor.Data = uintptr(offset >> 3 << 3)
		}
		inRegion := ptrs&16 != 0
		if inRegion {
			m.Tensor.Data, m.Tensor.ByteOffset = base+uintptr(offset%uint64(regionPages*page)), 0
		}
		if ptrs&32 != 0 {
			m.Tensor.Shape = base + uintptr(offset%uint64(regionPages*page))&^7
		}
		if ptrs&64 != 0 {
			m.Deleter = []uintptr{base, base + uintptr(page), addr(m), base + 2*uintptr(page), base + 4*uintptr(page)}[offset%5]
		}
		var opts []dlpack.ImportOption
		readOnly := ptrs&128 != 0
		if readOnly {
			opts = append(opts, dlpack.AllowReadOnly())
		}
		b, err := dlpack.Import(addr(m), opts...)
		runtime.KeepAlive(&arr)
		if err != nil {
			if !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrNotSupported) && !errors.Is(err, cuda.ErrNoDriver) {
				t.Fatalf("an error matching no sentinel: %v", err)
			}
			return
		}
		defer b.Close()
		if m.Deleter != 0 {
			t.Fatalf("a tensor with a deleter at %#x, which is not code, was accepted", m.Deleter)
		}
		// What was accepted must be usable: in the region, every page
		// readable (and writable without AllowReadOnly). Read it all, and
		// write it back there, where the memory is the fuzzer's own.
		if inRegion && b.Size() > 0 && b.HostAccessible() {
			lo := int(uintptr(b.Ptr()) - base)
			hi := lo + int(b.Size())
			for i := lo / page; i <= (hi-1)/page; i++ {
				if i >= regionPages {
					return // the tensor runs past the region, into memory not ours
				}
				if k := pageKind(i); k == 0 || (k == 1 && !readOnly) {
					t.Fatalf("accepted %d bytes at region offset %d, over region page %d (kind %d, read-only %v)", b.Size(), lo, i, k, readOnly)
				}
			}
			got := make([]byte, b.Size())
			if _, err := b.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !readOnly {
				if _, err := b.WriteAt(got, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		runtime.KeepAlive(h)
	})
}
