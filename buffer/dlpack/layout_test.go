package dlpack_test

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"

	"github.com/cudamem/cudamem/buffer/dlpack"
)

// layout is what dlpack.h's structs look like in C on one kind of target.
type layout struct {
	tensor, managed, versioned     uintptr // sizes
	byteOffset                     uintptr // DLTensor.byte_offset
	shape, strides                 uintptr // DLTensor.shape, .strides
	managedCtx, managedDeleter     uintptr // DLManagedTensor
	versionedCtx, versionedDeleter uintptr // DLManagedTensorVersioned
	flags, versionedTensor         uintptr
}

// cLayout is the C layout for this target: pointers of 8 bytes; or of 4
// with 64-bit fields aligned to 4 (i386 System V) or 8 (ARM EABI, MIPS
// o32).
func cLayout() layout {
	switch {
	case unsafe.Sizeof(uintptr(0)) == 8:
		return layout{tensor: 48, managed: 64, versioned: 80, byteOffset: 40, shape: 24, strides: 32,
			managedCtx: 48, managedDeleter: 56, versionedCtx: 8, versionedDeleter: 16, flags: 24, versionedTensor: 32}
	case runtime.GOARCH == "386":
		return layout{tensor: 36, managed: 44, versioned: 60, byteOffset: 28, shape: 20, strides: 24,
			managedCtx: 36, managedDeleter: 40, versionedCtx: 8, versionedDeleter: 12, flags: 16, versionedTensor: 24}
	default:
		return layout{tensor: 40, managed: 48, versioned: 64, byteOffset: 32, shape: 20, strides: 24,
			managedCtx: 40, managedDeleter: 44, versionedCtx: 8, versionedDeleter: 12, flags: 16, versionedTensor: 24}
	}
}

func TestLayout(t *testing.T) {
	var tn dlpack.Tensor
	var m dlpack.ManagedTensor
	var v dlpack.ManagedTensorVersioned
	want := cLayout()
	got := layout{
		tensor: unsafe.Sizeof(tn), managed: unsafe.Sizeof(m), versioned: unsafe.Sizeof(v),
		byteOffset: unsafe.Offsetof(tn.ByteOffset), shape: unsafe.Offsetof(tn.Shape), strides: unsafe.Offsetof(tn.Strides),
		managedCtx: unsafe.Offsetof(m.ManagerCtx), managedDeleter: unsafe.Offsetof(m.Deleter),
		versionedCtx: unsafe.Offsetof(v.ManagerCtx), versionedDeleter: unsafe.Offsetof(v.Deleter),
		flags: unsafe.Offsetof(v.Flags), versionedTensor: unsafe.Offsetof(v.Tensor),
	}
	assert.Equal(t, want, got)

	// The fields every target lays out alike.
	assert.Equal(t, uintptr(8), unsafe.Sizeof(dlpack.Version{}))
	assert.Equal(t, uintptr(8), unsafe.Sizeof(dlpack.Device{}))
	assert.Equal(t, uintptr(4), unsafe.Sizeof(dlpack.DataType{}))
	assert.Equal(t, uintptr(4), unsafe.Sizeof(dlpack.DeviceType(0)))
	ptr := unsafe.Sizeof(uintptr(0))
	assert.Equal(t, ptr, unsafe.Offsetof(tn.Device))
	assert.Equal(t, ptr+8, unsafe.Offsetof(tn.NDim))
	assert.Equal(t, ptr+12, unsafe.Offsetof(tn.DType))
	assert.Equal(t, uintptr(0), unsafe.Offsetof(v.Version))
	assert.Equal(t, uintptr(2), unsafe.Offsetof(tn.DType.Lanes))
}

// TestLayoutMatchesC compares with what the C compiler says, on this
// machine.
func TestLayoutMatchesC(t *testing.T) {
	l := needC(t)
	var tn dlpack.Tensor
	var m dlpack.ManagedTensor
	var v dlpack.ManagedTensorVersioned
	for i, want := range []uintptr{unsafe.Sizeof(tn), unsafe.Sizeof(m), unsafe.Sizeof(v), unsafe.Offsetof(tn.ByteOffset),
		unsafe.Offsetof(v.Tensor), unsafe.Offsetof(m.Deleter), unsafe.Offsetof(v.Flags), unsafe.Offsetof(tn.Shape)} {
		assert.Equal(t, int64(want), l.Layout(i), "fact %d (see dlt_layout)", i)
	}
}

func TestDeviceTypeNames(t *testing.T) {
	assert.Equal(t, "kDLCUDA", dlpack.CUDA.String())
	assert.Equal(t, "kDLCUDAManaged", dlpack.CUDAManaged.String())
	assert.Equal(t, "DeviceType(99)", dlpack.DeviceType(99).String())
	assert.Equal(t, "kDLCUDAHost:0", dlpack.Device{Type: dlpack.CUDAHost}.String())
	for v, want := range map[dlpack.DeviceType]int32{dlpack.CPU: 1, dlpack.CUDA: 2, dlpack.CUDAHost: 3, dlpack.OpenCL: 4,
		dlpack.Vulkan: 7, dlpack.Metal: 8, dlpack.VPI: 9, dlpack.ROCM: 10, dlpack.ROCMHost: 11, dlpack.ExtDev: 12,
		dlpack.CUDAManaged: 13, dlpack.OneAPI: 14, dlpack.WebGPU: 15, dlpack.Hexagon: 16, dlpack.MAIA: 17, dlpack.Trn: 18} {
		assert.Equal(t, want, int32(v), v.String())
	}
	assert.Equal(t, dlpack.DataType{Code: 1, Bits: 8, Lanes: 1}, dlpack.Byte, "uint8")
	assert.Equal(t, uint64(1), dlpack.FlagReadOnly)
	assert.Equal(t, uint64(2), dlpack.FlagIsCopied)
	assert.Equal(t, uint64(4), dlpack.FlagIsSubbytePadded)
}
