//go:build linux

package dlpack_test

import (
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
)

// FuzzImport fills a versioned tensor's fields (and its shape and strides
// arrays) from the input and imports it: garbage gives an error or a
// Buffer over mapped memory, never a crash. The deleter stays null, so
// nothing the fuzzer writes is ever called.
func FuzzImport(f *testing.F) {
	needSupported(f)
	f.Add(uint32(1), int32(1), int32(0), int32(1), uint8(1), uint8(8), uint16(1), uint64(0), uint64(0), uint8(0), []byte{16, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint32(1), int32(2), int32(0), int32(2), uint8(2), uint8(32), uint16(1), uint64(8), uint64(1), uint8(3), make([]byte, 32))
	f.Add(uint32(2), int32(13), int32(-1), int32(-3), uint8(0), uint8(0), uint16(0), ^uint64(0), uint64(7), uint8(255), []byte{0xff})
	f.Fuzz(func(t *testing.T, major uint32, devType, devID, ndim int32, code, bits uint8, lanes uint16, offset, flags uint64, ptrs uint8, dims []byte) {
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
		b, err := dlpack.Import(addr(m))
		runtime.KeepAlive(&arr)
		if err != nil {
			if !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrNotSupported) && !errors.Is(err, cuda.ErrNoDriver) {
				t.Fatalf("an error matching no sentinel: %v", err)
			}
			return
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		runtime.KeepAlive(h)
	})
}
