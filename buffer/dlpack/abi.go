package dlpack

import "fmt"

// The C ABI of DLPack (dlpack.h, version 1.x), written from the header's
// documented layout. Pointer fields are uintptr so that every struct has
// the C layout of the target it is built for: 8-byte pointers on 64-bit
// targets, 4-byte ones on 32-bit targets. Go aligns 64-bit fields to 4
// bytes on every 32-bit target; the i386 System V ABI does too, but the
// ARM EABI and MIPS o32 ABIs align them to 8, so there an explicit pad
// (pad64, in the target's pad file) puts Tensor.ByteOffset where C has
// it. layout_test.go checks sizes and offsets for each case.

// MajorVersion and MinorVersion are the DLPack version this package
// produces (in ManagedTensorVersioned.Version) and understands. Import
// refuses another major version (its layout may differ); a newer minor
// version only adds enumeration values, and is accepted.
const (
	MajorVersion = 1
	MinorVersion = 1
)

// Version is DLPackVersion.
type Version struct {
	Major uint32
	Minor uint32
}

// DeviceType is DLDeviceType (a C enum: 32 bits).
type DeviceType int32

// The device types of dlpack.h. This package exports CPU, CUDA and
// CUDAHost, and imports those and CUDAManaged; the others are listed so
// that errors can name them.
const (
	CPU         DeviceType = 1  // host memory
	CUDA        DeviceType = 2  // CUDA device memory
	CUDAHost    DeviceType = 3  // pinned host memory (cudaMallocHost)
	OpenCL      DeviceType = 4  // OpenCL
	Vulkan      DeviceType = 7  // Vulkan buffer
	Metal       DeviceType = 8  // Apple Metal
	VPI         DeviceType = 9  // Verilog simulator buffer
	ROCM        DeviceType = 10 // AMD ROCm device memory
	ROCMHost    DeviceType = 11 // pinned host memory of ROCm
	ExtDev      DeviceType = 12 // reserved extension device
	CUDAManaged DeviceType = 13 // CUDA managed (unified) memory
	OneAPI      DeviceType = 14 // oneAPI unified shared memory
	WebGPU      DeviceType = 15 // WebGPU
	Hexagon     DeviceType = 16 // Qualcomm Hexagon DSP
	MAIA        DeviceType = 17 // Microsoft MAIA
	Trn         DeviceType = 18 // AWS Trainium
)

var deviceTypeNames = map[DeviceType]string{
	CPU: "kDLCPU", CUDA: "kDLCUDA", CUDAHost: "kDLCUDAHost", OpenCL: "kDLOpenCL", Vulkan: "kDLVulkan",
	Metal: "kDLMetal", VPI: "kDLVPI", ROCM: "kDLROCM", ROCMHost: "kDLROCMHost", ExtDev: "kDLExtDev",
	CUDAManaged: "kDLCUDAManaged", OneAPI: "kDLOneAPI", WebGPU: "kDLWebGPU", Hexagon: "kDLHexagon",
	MAIA: "kDLMAIA", Trn: "kDLTrn",
}

// String is the header's name of the device type ("kDLCUDA"), or
// "DeviceType(n)" for a value the header does not define.
func (t DeviceType) String() string {
	if s, ok := deviceTypeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("DeviceType(%d)", int32(t))
}

// known reports whether dlpack.h defines t.
func (t DeviceType) known() bool { _, ok := deviceTypeNames[t]; return ok }

// Device is DLDevice: a device type and the device's index (0 for CPU,
// pinned and, by convention, managed memory).
type Device struct {
	Type DeviceType
	ID   int32
}

// String reads like "kDLCUDA:0".
func (d Device) String() string { return fmt.Sprintf("%v:%d", d.Type, d.ID) }

// DataTypeCode is DLDataTypeCode, stored in 8 bits in DataType.
type DataTypeCode uint8

// The type codes of dlpack.h.
const (
	Int             DataTypeCode = 0
	UInt            DataTypeCode = 1
	Float           DataTypeCode = 2
	OpaqueHandle    DataTypeCode = 3
	Bfloat          DataTypeCode = 4
	Complex         DataTypeCode = 5
	Bool            DataTypeCode = 6
	Float8E3M4      DataTypeCode = 7
	Float8E4M3      DataTypeCode = 8
	Float8E4M3B11FN DataTypeCode = 9
	Float8E4M3FN    DataTypeCode = 10
	Float8E4M3FNUZ  DataTypeCode = 11
	Float8E5M2      DataTypeCode = 12
	Float8E5M2FNUZ  DataTypeCode = 13
	Float8E8M0FNU   DataTypeCode = 14
	Float6E2M3FN    DataTypeCode = 15
	Float6E3M2FN    DataTypeCode = 16
	Float4E2M1FN    DataTypeCode = 17
)

// DataType is DLDataType: an element is Lanes values of Bits bits each.
type DataType struct {
	Code  DataTypeCode
	Bits  uint8
	Lanes uint16
}

// Byte is the type Export gives its tensors: uint8, one lane.
var Byte = DataType{Code: UInt, Bits: 8, Lanes: 1}

// Tensor is DLTensor. Shape and Strides are C pointers to NDim int64
// values each (Strides may be 0: a compact row-major tensor); Data is the
// memory's address, ByteOffset the offset of the first element from it.
type Tensor struct {
	Data       uintptr
	Device     Device
	NDim       int32
	DType      DataType
	Shape      uintptr
	Strides    uintptr
	_          [pad64]byte
	ByteOffset uint64
}

// ManagedTensor is DLManagedTensor, the unversioned (pre-1.0, "legacy")
// form. Deleter is a C function pointer, void (*)(DLManagedTensor *).
type ManagedTensor struct {
	Tensor     Tensor
	ManagerCtx uintptr
	Deleter    uintptr
}

// ManagedTensorVersioned is DLManagedTensorVersioned, the current form.
// Deleter is a C function pointer, void (*)(DLManagedTensorVersioned *);
// everything up to Flags keeps its place in every future major version,
// so the deleter of any versioned tensor can be called.
type ManagedTensorVersioned struct {
	Version    Version
	ManagerCtx uintptr
	Deleter    uintptr
	Flags      uint64
	Tensor     Tensor
}

// The flag bits of ManagedTensorVersioned.Flags.
const (
	// FlagReadOnly: the consumer must not write the memory.
	FlagReadOnly uint64 = 1 << 0
	// FlagIsCopied: the producer made the tensor a copy for the consumer.
	FlagIsCopied uint64 = 1 << 1
	// FlagIsSubbytePadded: elements of a sub-byte type are padded to a
	// byte each (by default they are packed).
	FlagIsSubbytePadded uint64 = 1 << 2
)
