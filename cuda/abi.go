package cuda

import (
	"strconv"
	"strings"
)

// This file mirrors the driver's memory-related types and constants. Struct
// layouts match the C definitions on the 64-bit targets CUDA supports
// (linux/amd64, linux/arm64, windows/amd64): pointers and size_t are 8 bytes,
// int, unsigned int and enums 4. abi_test.go pins every size and offset.

// DevicePtr is a CUdeviceptr: an address in the unified virtual address space
// of a device allocation. It is an integer, never a Go pointer.
type DevicePtr uint64

// MemHandle is a CUmemGenericAllocationHandle: the physical allocation that
// cuMemCreate returns and cuMemMap maps into a reserved address range.
type MemHandle uint64

// IPCHandleSize is the size in bytes of the opaque IPC and fabric handles.
const IPCHandleSize = 64

// IPCMemHandle is a CUipcMemHandle: the opaque token cuIpcGetMemHandle
// produces for a cuMemAlloc allocation so another process can open it. It is a
// struct, not an array, because cuIpcOpenMemHandle takes it by value.
type IPCMemHandle struct {
	Reserved [IPCHandleSize]byte
}

// MemFabricHandle is a CUmemFabricHandle: the opaque token a MemHandle
// exported with MemHandleTypeFabric becomes, importable on other nodes of the
// same NVLink fabric.
type MemFabricHandle struct {
	Data [IPCHandleSize]byte
}

// MemPoolPtrExportData is a CUmemPoolPtrExportData: the opaque description
// of one allocation in an exported memory pool, sent to the importing process.
type MemPoolPtrExportData struct {
	Reserved [64]byte
}

// MemLocationType is a CUmemLocationType: what kind of place a MemLocation
// names, and so how its ID is read.
type MemLocationType int32

// Memory location types.
const (
	MemLocationTypeInvalid MemLocationType = 0
	// MemLocationTypeNone means no preferred location (managed memory pools).
	MemLocationTypeNone MemLocationType = 0
	// MemLocationTypeDevice: ID is a device ordinal.
	MemLocationTypeDevice MemLocationType = 1
	// MemLocationTypeHost: ID is ignored.
	MemLocationTypeHost MemLocationType = 2
	// MemLocationTypeHostNUMA: ID is a host NUMA node.
	MemLocationTypeHostNUMA MemLocationType = 3
	// MemLocationTypeHostNUMACurrent: the calling thread's NUMA node; ID is
	// ignored.
	MemLocationTypeHostNUMACurrent MemLocationType = 4
)

// MemLocation is a CUmemLocation: a device, the host, or a host NUMA node.
type MemLocation struct {
	Type MemLocationType
	ID   int32
}

// Pack returns l's 8 bytes read as a little-endian uint64: Type in the low 32
// bits, ID in the high 32. Entry points that take a CUmemLocation by value
// (cuMemPrefetchAsync_v2, cuMemAdvise_v2) receive it in one integer register
// on every supported target, so this is the word to pass.
func (l MemLocation) Pack() uint64 {
	return uint64(uint32(l.Type)) | uint64(uint32(l.ID))<<32
}

// MemAllocationType is a CUmemAllocationType: the kind of physical memory
// cuMemCreate or a memory pool provides.
type MemAllocationType int32

// Allocation types.
const (
	MemAllocationTypeInvalid MemAllocationType = 0
	// MemAllocationTypePinned memory stays where it was placed while in use.
	MemAllocationTypePinned MemAllocationType = 1
	// MemAllocationTypeManaged memory may migrate (managed memory pools).
	MemAllocationTypeManaged MemAllocationType = 2
)

// MemHandleType is a CUmemAllocationHandleType: a way to export an
// allocation or pool to another process. Values are bits and may be OR'ed
// where a set of types is requested.
type MemHandleType uint32

// Shareable handle types.
const (
	MemHandleTypeNone MemHandleType = 0x0
	// MemHandleTypePosixFileDescriptor exports a file descriptor (int).
	MemHandleTypePosixFileDescriptor MemHandleType = 0x1
	// MemHandleTypeWin32 exports an NT HANDLE.
	MemHandleTypeWin32 MemHandleType = 0x2
	// MemHandleTypeWin32KMT exports a D3DKMT_HANDLE.
	MemHandleTypeWin32KMT MemHandleType = 0x4
	// MemHandleTypeFabric exports a MemFabricHandle.
	MemHandleTypeFabric MemHandleType = 0x8
)

// MemAllocationCompType is a CUmemAllocationCompType: whether cuMemCreate
// should ask for compressible memory. In MemAllocationProp it is one byte.
type MemAllocationCompType uint8

// Compression requests.
const (
	MemAllocationCompNone    MemAllocationCompType = 0x0
	MemAllocationCompGeneric MemAllocationCompType = 0x1
)

// Usage bits for MemAllocationPropFlags.Usage (cuMemCreate).
const (
	MemCreateUsageTilePool     = 0x1
	MemCreateUsageHWDecompress = 0x2
)

// MemPoolCreateUsageHWDecompress is a usage bit for MemPoolProps.Usage: the
// pool's memory serves as hardware decompression buffers.
const MemPoolCreateUsageHWDecompress = 0x2

// MemAllocationPropFlags is the nested allocFlags struct of
// CUmemAllocationProp. It is 8 bytes: two one-byte fields, a two-byte usage
// mask and four reserved bytes.
type MemAllocationPropFlags struct {
	CompressionType      MemAllocationCompType
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// MemAllocationProp is a CUmemAllocationProp: what cuMemCreate should
// allocate, and what cuMemGetAllocationGranularity and
// cuMemGetAllocationPropertiesFromHandle describe.
type MemAllocationProp struct {
	Type                 MemAllocationType
	RequestedHandleTypes MemHandleType
	Location             MemLocation
	// Win32HandleMetaData points to Windows OBJECT_ATTRIBUTES when
	// RequestedHandleTypes includes MemHandleTypeWin32; otherwise it is 0.
	// The caller keeps that memory alive and unmoved during the call.
	Win32HandleMetaData uintptr
	AllocFlags          MemAllocationPropFlags
}

// MemAccessFlags is a CUmemAccess_flags: the protection a mapping grants to a
// location.
type MemAccessFlags uint32

// Access protections.
const (
	MemAccessProtNone      MemAccessFlags = 0x0
	MemAccessProtRead      MemAccessFlags = 0x1
	MemAccessProtReadWrite MemAccessFlags = 0x3
)

// MemAccessDesc is a CUmemAccessDesc: one location and the access it gets, as
// passed to cuMemSetAccess and cuMemPoolSetAccess.
type MemAccessDesc struct {
	Location MemLocation
	Flags    MemAccessFlags
}

// MemPoolProps is a CUmemPoolProps: how cuMemPoolCreate should make a pool.
type MemPoolProps struct {
	AllocType   MemAllocationType
	HandleTypes MemHandleType
	Location    MemLocation
	// Win32SecurityAttributes points to Windows SECURITY_ATTRIBUTES when
	// HandleTypes includes MemHandleTypeWin32; otherwise it is 0.
	Win32SecurityAttributes uintptr
	// MaxSize caps the pool in bytes; 0 picks a system-dependent default.
	MaxSize  uint64
	Usage    uint16
	Reserved [54]byte
}

// MemPoolAttribute is a CUmemPool_attribute, read and written with
// cuMemPoolGetAttribute and cuMemPoolSetAttribute. The Reuse* attributes are
// int-valued; the others are 64-bit byte counts.
type MemPoolAttribute int32

// Memory pool attributes.
const (
	MemPoolAttrReuseFollowEventDependencies   MemPoolAttribute = 1
	MemPoolAttrReuseAllowOpportunistic        MemPoolAttribute = 2
	MemPoolAttrReuseAllowInternalDependencies MemPoolAttribute = 3
	MemPoolAttrReleaseThreshold               MemPoolAttribute = 4
	MemPoolAttrReservedMemCurrent             MemPoolAttribute = 5
	MemPoolAttrReservedMemHigh                MemPoolAttribute = 6
	MemPoolAttrUsedMemCurrent                 MemPoolAttribute = 7
	MemPoolAttrUsedMemHigh                    MemPoolAttribute = 8
)

// memPoolAttrNames holds the names of MemPoolAttribute values 1, 2, 3, ... in order:
// each constant's name without its MemPoolAttr prefix (abi_test.go checks the
// list against the constants).
var memPoolAttrNames = strings.Fields(`
	ReuseFollowEventDependencies ReuseAllowOpportunistic ReuseAllowInternalDependencies
	ReleaseThreshold ReservedMemCurrent ReservedMemHigh UsedMemCurrent UsedMemHigh
`)

// String returns the attribute's Go name without its prefix, e.g.
// "ReleaseThreshold", or "MemPoolAttribute(N)" for an unknown value.
func (a MemPoolAttribute) String() string {
	return enumName(memPoolAttrNames, 1, int(a), "MemPoolAttribute")
}

// MemAllocationGranularity is a CUmemAllocationGranularity_flags: which
// granularity cuMemGetAllocationGranularity reports.
type MemAllocationGranularity int32

// Granularity kinds.
const (
	// MemAllocationGranularityMinimum is the granularity sizes and offsets
	// must be multiples of.
	MemAllocationGranularityMinimum MemAllocationGranularity = 0x0
	// MemAllocationGranularityRecommended is the granularity that performs
	// best.
	MemAllocationGranularityRecommended MemAllocationGranularity = 0x1
)

// MemAdvice is a CUmem_advise: a hint for cuMemAdvise about managed memory.
type MemAdvice int32

// Managed memory advice.
const (
	MemAdviseSetReadMostly          MemAdvice = 1
	MemAdviseUnsetReadMostly        MemAdvice = 2
	MemAdviseSetPreferredLocation   MemAdvice = 3
	MemAdviseUnsetPreferredLocation MemAdvice = 4
	MemAdviseSetAccessedBy          MemAdvice = 5
	MemAdviseUnsetAccessedBy        MemAdvice = 6
)

// MemAttachFlags is a CUmemAttach_flags: who may access managed memory, for
// cuMemAllocManaged and cuStreamAttachMemAsync.
type MemAttachFlags uint32

// Managed memory attachment.
const (
	// MemAttachGlobal: any stream on any device.
	MemAttachGlobal MemAttachFlags = 0x1
	// MemAttachHost: the host only, until attached to a stream.
	MemAttachHost MemAttachFlags = 0x2
	// MemAttachSingle: one stream (cuStreamAttachMemAsync only).
	MemAttachSingle MemAttachFlags = 0x4
)

// MemoryType is a CUmemorytype: where memory physically lives, as
// PointerInfo.Type reports it.
type MemoryType int32

// Memory types.
const (
	MemoryTypeHost    MemoryType = 0x1
	MemoryTypeDevice  MemoryType = 0x2
	MemoryTypeArray   MemoryType = 0x3
	MemoryTypeUnified MemoryType = 0x4
)

// pointerAttr is a CUpointer_attribute, queried with cuPointerGetAttribute;
// only those QueryPointer reads are named.
type pointerAttr int32

const (
	pointerAttrMemoryType     pointerAttr = 2
	pointerAttrIsManaged      pointerAttr = 8
	pointerAttrDeviceOrdinal  pointerAttr = 9
	pointerAttrRangeStartAddr pointerAttr = 11
	pointerAttrRangeSize      pointerAttr = 12
	pointerAttrMemPoolHandle  pointerAttr = 17
)

// DeviceAttribute is a CUdevice_attribute, queried with [Device.Attribute].
// Only the attributes this module reads and those about memory are named;
// any other attribute of the driver API is DeviceAttribute(n), with n its
// value in the CUDA header, and String names every value of the CUDA 13.0
// header.
type DeviceAttribute int32

// Device attributes.
const (
	DeviceAttrIntegrated                             DeviceAttribute = 18
	DeviceAttrCanMapHostMemory                       DeviceAttribute = 19
	DeviceAttrGlobalMemoryBusWidth                   DeviceAttribute = 37
	DeviceAttrL2CacheSize                            DeviceAttribute = 38
	DeviceAttrAsyncEngineCount                       DeviceAttribute = 40
	DeviceAttrUnifiedAddressing                      DeviceAttribute = 41
	DeviceAttrComputeCapabilityMajor                 DeviceAttribute = 75
	DeviceAttrComputeCapabilityMinor                 DeviceAttribute = 76
	DeviceAttrManagedMemory                          DeviceAttribute = 83
	DeviceAttrPageableMemoryAccess                   DeviceAttribute = 88
	DeviceAttrConcurrentManagedAccess                DeviceAttribute = 89
	DeviceAttrCanUseHostPointerForRegisteredMem      DeviceAttribute = 91
	DeviceAttrHostRegisterSupported                  DeviceAttribute = 99
	DeviceAttrPageableMemoryAccessUsesHostPageTables DeviceAttribute = 100
	DeviceAttrDirectManagedMemAccessFromHost         DeviceAttribute = 101
	DeviceAttrVirtualMemoryManagementSupported       DeviceAttribute = 102
	DeviceAttrHandleTypePosixFileDescriptorSupported DeviceAttribute = 103
	DeviceAttrHandleTypeWin32HandleSupported         DeviceAttribute = 104
	DeviceAttrGenericCompressionSupported            DeviceAttribute = 107
	DeviceAttrGPUDirectRDMAWithCUDAVMMSupported      DeviceAttribute = 110
	DeviceAttrReadOnlyHostRegisterSupported          DeviceAttribute = 113
	DeviceAttrMemoryPoolsSupported                   DeviceAttribute = 115
	DeviceAttrGPUDirectRDMASupported                 DeviceAttribute = 116
	DeviceAttrMemPoolSupportedHandleTypes            DeviceAttribute = 119
	DeviceAttrDMABufSupported                        DeviceAttribute = 124
	DeviceAttrIPCEventSupported                      DeviceAttribute = 125
	DeviceAttrHandleTypeFabricSupported              DeviceAttribute = 128
	DeviceAttrNUMAConfig                             DeviceAttribute = 130
	DeviceAttrNUMAID                                 DeviceAttribute = 131
	DeviceAttrMulticastSupported                     DeviceAttribute = 132
	DeviceAttrHostNUMAID                             DeviceAttribute = 134
	DeviceAttrHostMemoryPoolsSupported               DeviceAttribute = 144
	DeviceAttrHostVirtualMemoryManagementSupported   DeviceAttribute = 145
)

// deviceAttrNames holds the names of DeviceAttribute values 1, 2, 3, ... in
// order: the attribute's name in Go form, which for a named constant is its
// name without the DeviceAttr prefix (abi_test.go checks the list against the
// constants and the header).
var deviceAttrNames = strings.Fields(`
	MaxThreadsPerBlock MaxBlockDimX MaxBlockDimY MaxBlockDimZ MaxGridDimX MaxGridDimY
	MaxGridDimZ MaxSharedMemoryPerBlock TotalConstantMemory WarpSize MaxPitch
	MaxRegistersPerBlock ClockRate TextureAlignment GPUOverlap MultiprocessorCount
	KernelExecTimeout Integrated CanMapHostMemory ComputeMode MaximumTexture1DWidth
	MaximumTexture2DWidth MaximumTexture2DHeight MaximumTexture3DWidth MaximumTexture3DHeight
	MaximumTexture3DDepth MaximumTexture2DLayeredWidth MaximumTexture2DLayeredHeight
	MaximumTexture2DLayeredLayers SurfaceAlignment ConcurrentKernels ECCEnabled PCIBusID
	PCIDeviceID TCCDriver MemoryClockRate GlobalMemoryBusWidth L2CacheSize
	MaxThreadsPerMultiprocessor AsyncEngineCount UnifiedAddressing MaximumTexture1DLayeredWidth
	MaximumTexture1DLayeredLayers CanTex2DGather MaximumTexture2DGatherWidth
	MaximumTexture2DGatherHeight MaximumTexture3DWidthAlternate MaximumTexture3DHeightAlternate
	MaximumTexture3DDepthAlternate PCIDomainID TexturePitchAlignment MaximumTextureCubemapWidth
	MaximumTextureCubemapLayeredWidth MaximumTextureCubemapLayeredLayers MaximumSurface1DWidth
	MaximumSurface2DWidth MaximumSurface2DHeight MaximumSurface3DWidth MaximumSurface3DHeight
	MaximumSurface3DDepth MaximumSurface1DLayeredWidth MaximumSurface1DLayeredLayers
	MaximumSurface2DLayeredWidth MaximumSurface2DLayeredHeight MaximumSurface2DLayeredLayers
	MaximumSurfaceCubemapWidth MaximumSurfaceCubemapLayeredWidth
	MaximumSurfaceCubemapLayeredLayers MaximumTexture1DLinearWidth MaximumTexture2DLinearWidth
	MaximumTexture2DLinearHeight MaximumTexture2DLinearPitch MaximumTexture2DMipmappedWidth
	MaximumTexture2DMipmappedHeight ComputeCapabilityMajor ComputeCapabilityMinor
	MaximumTexture1DMipmappedWidth StreamPrioritiesSupported GlobalL1CacheSupported
	LocalL1CacheSupported MaxSharedMemoryPerMultiprocessor MaxRegistersPerMultiprocessor
	ManagedMemory MultiGPUBoard MultiGPUBoardGroupID HostNativeAtomicSupported
	SingleToDoublePrecisionPerfRatio PageableMemoryAccess ConcurrentManagedAccess
	ComputePreemptionSupported CanUseHostPointerForRegisteredMem CanUseStreamMemOpsV1
	CanUse64BitStreamMemOpsV1 CanUseStreamWaitValueNORV1 CooperativeLaunch
	CooperativeMultiDeviceLaunch MaxSharedMemoryPerBlockOptin CanFlushRemoteWrites
	HostRegisterSupported PageableMemoryAccessUsesHostPageTables DirectManagedMemAccessFromHost
	VirtualMemoryManagementSupported HandleTypePosixFileDescriptorSupported
	HandleTypeWin32HandleSupported HandleTypeWin32KMTHandleSupported MaxBlocksPerMultiprocessor
	GenericCompressionSupported MaxPersistingL2CacheSize MaxAccessPolicyWindowSize
	GPUDirectRDMAWithCUDAVMMSupported ReservedSharedMemoryPerBlock SparseCUDAArraySupported
	ReadOnlyHostRegisterSupported TimelineSemaphoreInteropSupported MemoryPoolsSupported
	GPUDirectRDMASupported GPUDirectRDMAFlushWritesOptions GPUDirectRDMAWritesOrdering
	MemPoolSupportedHandleTypes ClusterLaunch DeferredMappingCUDAArraySupported
	CanUse64BitStreamMemOps CanUseStreamWaitValueNOR DMABufSupported IPCEventSupported
	MemSyncDomainCount TensorMapAccessSupported HandleTypeFabricSupported
	UnifiedFunctionPointers NUMAConfig NUMAID MulticastSupported MPSEnabled HostNUMAID
	D3D12CIGSupported MemDecompressAlgorithmMask MemDecompressMaximumLength VulkanCIGSupported
	GPUPCIDeviceID GPUPCISubsystemID HostNUMAVirtualMemoryManagementSupported
	HostNUMAMemoryPoolsSupported HostNUMAMultinodeIPCSupported HostMemoryPoolsSupported
	HostVirtualMemoryManagementSupported HostAllocDMABufSupported
	OnlyPartialHostNativeAtomicSupported
`)

// String returns the attribute's Go name without its prefix, e.g.
// "ComputeCapabilityMajor", or "DeviceAttribute(N)" for an unknown value.
func (a DeviceAttribute) String() string {
	return enumName(deviceAttrNames, 1, int(a), "DeviceAttribute")
}

// StreamFlags is a CUstream_flags, for cuStreamCreate.
type StreamFlags uint32

// Stream creation flags.
const (
	StreamDefault StreamFlags = 0x0
	// StreamNonBlocking streams do not synchronize with the legacy NULL
	// stream.
	StreamNonBlocking StreamFlags = 0x1
)

// EventFlags is a CUevent_flags, for cuEventCreate.
type EventFlags uint32

// Event creation flags.
const (
	EventDefault       EventFlags = 0x0
	EventBlockingSync  EventFlags = 0x1
	EventDisableTiming EventFlags = 0x2
	// EventInterprocess events can be shared with cuIpcGetEventHandle; they
	// must also have EventDisableTiming.
	EventInterprocess EventFlags = 0x4
)

// IPCMemFlags is a CUipcMem_flags, for cuIpcOpenMemHandle.
type IPCMemFlags uint32

// IPC open flags.
const (
	// IPCMemLazyEnablePeerAccess enables peer access between the devices
	// involved as it becomes needed.
	IPCMemLazyEnablePeerAccess IPCMemFlags = 0x1
)

// MemHostAllocFlags are the CU_MEMHOSTALLOC_* bits for cuMemHostAlloc.
type MemHostAllocFlags uint32

// Pinned host allocation flags.
const (
	// MemHostAllocPortable memory is pinned for every context, not just the
	// current one.
	MemHostAllocPortable MemHostAllocFlags = 0x01
	// MemHostAllocDeviceMap maps the memory into the device address space
	// (see cuMemHostGetDevicePointer).
	MemHostAllocDeviceMap MemHostAllocFlags = 0x02
	// MemHostAllocWriteCombined memory is fast for the device to read over
	// PCIe and slow for the host to read.
	MemHostAllocWriteCombined MemHostAllocFlags = 0x04
)

// MemHostRegisterFlags are the CU_MEMHOSTREGISTER_* bits for
// cuMemHostRegister.
type MemHostRegisterFlags uint32

// Host registration flags.
const (
	MemHostRegisterPortable  MemHostRegisterFlags = 0x01
	MemHostRegisterDeviceMap MemHostRegisterFlags = 0x02
	// MemHostRegisterIOMemory registers I/O memory (such as a PCIe BAR)
	// rather than system RAM.
	MemHostRegisterIOMemory MemHostRegisterFlags = 0x04
	// MemHostRegisterReadOnly maps the memory read-only for the device.
	MemHostRegisterReadOnly MemHostRegisterFlags = 0x08
)

// enumName returns the name of value v from names, the names of values
// first, first+1, first+2, ..., and otherwise "typ(v)".
func enumName(names []string, first, v int, typ string) string {
	if v >= first && v-first < len(names) {
		return names[v-first]
	}
	return typ + "(" + strconv.Itoa(v) + ")"
}
