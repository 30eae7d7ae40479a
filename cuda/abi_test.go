package cuda

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The expected numbers below were worked out by hand from the C struct
// definitions with the C alignment rules of LP64 (linux amd64/arm64) and
// LLP64 (windows amd64), which agree for these structs: 8-byte pointers,
// size_t and unsigned long long; 4-byte int, unsigned int and enums; 2-byte
// unsigned short; 1-byte unsigned char.
func TestABILayout(t *testing.T) {
	type field struct {
		name   string
		offset uintptr
		want   uintptr
	}
	for _, tc := range []struct {
		name        string // the C struct
		size, align uintptr
		wantSize    uintptr
		wantAlign   uintptr
		fields      []field
	}{
		{
			name: "CUuuid", size: unsafe.Sizeof(UUID{}), align: unsafe.Alignof(UUID{}),
			wantSize: 16, wantAlign: 1,
		},
		{
			name: "CUipcMemHandle", size: unsafe.Sizeof(IPCMemHandle{}), align: unsafe.Alignof(IPCMemHandle{}),
			wantSize: 64, wantAlign: 1,
			fields: []field{{"reserved", unsafe.Offsetof(IPCMemHandle{}.Reserved), 0}},
		},
		{
			name: "CUmemFabricHandle", size: unsafe.Sizeof(MemFabricHandle{}), align: unsafe.Alignof(MemFabricHandle{}),
			wantSize: 64, wantAlign: 1,
			fields: []field{{"data", unsafe.Offsetof(MemFabricHandle{}.Data), 0}},
		},
		{
			name: "CUmemPoolPtrExportData", size: unsafe.Sizeof(MemPoolPtrExportData{}), align: unsafe.Alignof(MemPoolPtrExportData{}),
			wantSize: 64, wantAlign: 1,
			fields: []field{{"reserved", unsafe.Offsetof(MemPoolPtrExportData{}.Reserved), 0}},
		},
		{
			name: "CUmemLocation", size: unsafe.Sizeof(MemLocation{}), align: unsafe.Alignof(MemLocation{}),
			wantSize: 8, wantAlign: 4,
			fields: []field{
				{"type", unsafe.Offsetof(MemLocation{}.Type), 0},
				{"id", unsafe.Offsetof(MemLocation{}.ID), 4},
			},
		},
		{
			name: "CUmemAllocationProp.allocFlags", size: unsafe.Sizeof(MemAllocationPropFlags{}), align: unsafe.Alignof(MemAllocationPropFlags{}),
			wantSize: 8, wantAlign: 2,
			fields: []field{
				{"compressionType", unsafe.Offsetof(MemAllocationPropFlags{}.CompressionType), 0},
				{"gpuDirectRDMACapable", unsafe.Offsetof(MemAllocationPropFlags{}.GPUDirectRDMACapable), 1},
				{"usage", unsafe.Offsetof(MemAllocationPropFlags{}.Usage), 2},
				{"reserved", unsafe.Offsetof(MemAllocationPropFlags{}.Reserved), 4},
			},
		},
		{
			name: "CUmemAllocationProp", size: unsafe.Sizeof(MemAllocationProp{}), align: unsafe.Alignof(MemAllocationProp{}),
			wantSize: 32, wantAlign: 8,
			fields: []field{
				{"type", unsafe.Offsetof(MemAllocationProp{}.Type), 0},
				{"requestedHandleTypes", unsafe.Offsetof(MemAllocationProp{}.RequestedHandleTypes), 4},
				{"location", unsafe.Offsetof(MemAllocationProp{}.Location), 8},
				{"win32HandleMetaData", unsafe.Offsetof(MemAllocationProp{}.Win32HandleMetaData), 16},
				{"allocFlags", unsafe.Offsetof(MemAllocationProp{}.AllocFlags), 24},
			},
		},
		{
			name: "CUmemAccessDesc", size: unsafe.Sizeof(MemAccessDesc{}), align: unsafe.Alignof(MemAccessDesc{}),
			wantSize: 12, wantAlign: 4,
			fields: []field{
				{"location", unsafe.Offsetof(MemAccessDesc{}.Location), 0},
				{"flags", unsafe.Offsetof(MemAccessDesc{}.Flags), 8},
			},
		},
		{
			name: "CUmemPoolProps", size: unsafe.Sizeof(MemPoolProps{}), align: unsafe.Alignof(MemPoolProps{}),
			wantSize: 88, wantAlign: 8,
			fields: []field{
				{"allocType", unsafe.Offsetof(MemPoolProps{}.AllocType), 0},
				{"handleTypes", unsafe.Offsetof(MemPoolProps{}.HandleTypes), 4},
				{"location", unsafe.Offsetof(MemPoolProps{}.Location), 8},
				{"win32SecurityAttributes", unsafe.Offsetof(MemPoolProps{}.Win32SecurityAttributes), 16},
				{"maxSize", unsafe.Offsetof(MemPoolProps{}.MaxSize), 24},
				{"usage", unsafe.Offsetof(MemPoolProps{}.Usage), 32},
				{"reserved", unsafe.Offsetof(MemPoolProps{}.Reserved), 34},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.wantSize, tc.size, "sizeof")
			assert.Equal(t, tc.wantAlign, tc.align, "alignof")
			for _, f := range tc.fields {
				assert.Equal(t, f.want, f.offset, "offsetof %s", f.name)
			}
		})
	}

	// Scalar typedefs and enums.
	assert.Equal(t, uintptr(8), unsafe.Sizeof(DevicePtr(0)), "CUdeviceptr")
	assert.Equal(t, uintptr(8), unsafe.Sizeof(MemHandle(0)), "CUmemGenericAllocationHandle")
	for name, size := range map[string]uintptr{
		"CUresult":                         unsafe.Sizeof(Result(0)),
		"CUmemLocationType":                unsafe.Sizeof(MemLocationType(0)),
		"CUmemAllocationType":              unsafe.Sizeof(MemAllocationType(0)),
		"CUmemAllocationHandleType":        unsafe.Sizeof(MemHandleType(0)),
		"CUmemAccess_flags":                unsafe.Sizeof(MemAccessFlags(0)),
		"CUmemPool_attribute":              unsafe.Sizeof(MemPoolAttribute(0)),
		"CUmemAllocationGranularity_flags": unsafe.Sizeof(MemAllocationGranularity(0)),
		"CUmem_advise":                     unsafe.Sizeof(MemAdvice(0)),
		"CUmemAttach_flags":                unsafe.Sizeof(MemAttachFlags(0)),
		"CUmemorytype":                     unsafe.Sizeof(MemoryType(0)),
		"CUpointer_attribute":              unsafe.Sizeof(pointerAttr(0)),
		"CUdevice_attribute":               unsafe.Sizeof(DeviceAttribute(0)),
		"CUstream_flags":                   unsafe.Sizeof(StreamFlags(0)),
		"CUevent_flags":                    unsafe.Sizeof(EventFlags(0)),
		"CUipcMem_flags":                   unsafe.Sizeof(IPCMemFlags(0)),
	} {
		assert.Equal(t, uintptr(4), size, "sizeof %s", name)
	}
}

func TestMemLocationPack(t *testing.T) {
	assert.Equal(t, uint64(0), MemLocation{}.Pack())
	assert.Equal(t, uint64(0x0000_0003_0000_0001), MemLocation{Type: MemLocationTypeDevice, ID: 3}.Pack())
	assert.Equal(t, uint64(0x0000_0001_0000_0003), MemLocation{Type: MemLocationTypeHostNUMA, ID: 1}.Pack())
	// A negative ID keeps its 32-bit two's complement form in the high word
	// and must not bleed into the type.
	assert.Equal(t, uint64(0xffff_ffff_0000_0002), MemLocation{Type: MemLocationTypeHost, ID: -1}.Pack())

	// Pack is exactly the in-memory bytes on a little-endian target.
	l := MemLocation{Type: MemLocationTypeHostNUMACurrent, ID: 0x01020304}
	if isLittleEndian() {
		assert.Equal(t, *(*uint64)(unsafe.Pointer(&l)), l.Pack())
	}
}

func isLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

func TestUUIDString(t *testing.T) {
	u := UUID{
		0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
		0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10,
	}
	assert.Equal(t, "GPU-01234567-89ab-cdef-fedc-ba9876543210", u.GPUString())
	assert.Equal(t, "01234567-89ab-cdef-fedc-ba9876543210", u.String())
	assert.Equal(t, "GPU-00000000-0000-0000-0000-000000000000", UUID{}.GPUString())
}

func TestEnumValues(t *testing.T) {
	// Values copied from the CUDA 13.0 header for the constants this module
	// relies on most; the header-driven tests below check the rest when the
	// header is available.
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"CU_MEM_LOCATION_TYPE_INVALID", int64(MemLocationTypeInvalid), 0},
		{"CU_MEM_LOCATION_TYPE_DEVICE", int64(MemLocationTypeDevice), 1},
		{"CU_MEM_LOCATION_TYPE_HOST", int64(MemLocationTypeHost), 2},
		{"CU_MEM_LOCATION_TYPE_HOST_NUMA", int64(MemLocationTypeHostNUMA), 3},
		{"CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT", int64(MemLocationTypeHostNUMACurrent), 4},
		{"CU_MEM_ALLOCATION_TYPE_PINNED", int64(MemAllocationTypePinned), 1},
		{"CU_MEM_ALLOCATION_TYPE_MANAGED", int64(MemAllocationTypeManaged), 2},
		{"CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", int64(MemHandleTypePosixFileDescriptor), 1},
		{"CU_MEM_HANDLE_TYPE_WIN32", int64(MemHandleTypeWin32), 2},
		{"CU_MEM_HANDLE_TYPE_WIN32_KMT", int64(MemHandleTypeWin32KMT), 4},
		{"CU_MEM_HANDLE_TYPE_FABRIC", int64(MemHandleTypeFabric), 8},
		{"CU_MEM_ACCESS_FLAGS_PROT_READ", int64(MemAccessProtRead), 1},
		{"CU_MEM_ACCESS_FLAGS_PROT_READWRITE", int64(MemAccessProtReadWrite), 3},
		{"CU_MEM_ALLOC_GRANULARITY_RECOMMENDED", int64(MemAllocationGranularityRecommended), 1},
		{"CU_MEMPOOL_ATTR_RELEASE_THRESHOLD", int64(MemPoolAttrReleaseThreshold), 4},
		{"CU_MEMPOOL_ATTR_USED_MEM_HIGH", int64(MemPoolAttrUsedMemHigh), 8},
		{"CU_MEM_ADVISE_SET_PREFERRED_LOCATION", int64(MemAdviseSetPreferredLocation), 3},
		{"CU_MEM_ATTACH_GLOBAL", int64(MemAttachGlobal), 1},
		{"CU_MEM_ATTACH_HOST", int64(MemAttachHost), 2},
		{"CU_MEM_ATTACH_SINGLE", int64(MemAttachSingle), 4},
		{"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", int64(DeviceAttrComputeCapabilityMajor), 75},
		{"CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY", int64(DeviceAttrManagedMemory), 83},
		{"CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS", int64(DeviceAttrConcurrentManagedAccess), 89},
		{"CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", int64(DeviceAttrVirtualMemoryManagementSupported), 102},
		{"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", int64(DeviceAttrHandleTypePosixFileDescriptorSupported), 103},
		{"CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED", int64(DeviceAttrMemoryPoolsSupported), 115},
		{"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED", int64(DeviceAttrGPUDirectRDMASupported), 116},
		{"CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES", int64(DeviceAttrMemPoolSupportedHandleTypes), 119},
		{"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED", int64(DeviceAttrHandleTypeFabricSupported), 128},
		{"CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID", int64(DeviceAttrHostNUMAID), 134},
		{"CU_STREAM_NON_BLOCKING", int64(StreamNonBlocking), 1},
		{"CU_EVENT_DISABLE_TIMING", int64(EventDisableTiming), 2},
		{"CU_EVENT_INTERPROCESS", int64(EventInterprocess), 4},
		{"CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS", int64(IPCMemLazyEnablePeerAccess), 1},
		{"CU_MEMHOSTALLOC_PORTABLE", int64(MemHostAllocPortable), 1},
		{"CU_MEMHOSTALLOC_DEVICEMAP", int64(MemHostAllocDeviceMap), 2},
		{"CU_MEMHOSTALLOC_WRITECOMBINED", int64(MemHostAllocWriteCombined), 4},
		{"CU_MEMHOSTREGISTER_READ_ONLY", int64(MemHostRegisterReadOnly), 8},
		{"CU_IPC_HANDLE_SIZE", IPCHandleSize, 64},
	} {
		assert.Equal(t, tc.want, tc.got, tc.name)
	}
}

func TestEnumStrings(t *testing.T) {
	assert.Equal(t, "ReleaseThreshold", MemPoolAttrReleaseThreshold.String())
	assert.Equal(t, "ReuseFollowEventDependencies", MemPoolAttrReuseFollowEventDependencies.String())
	assert.Equal(t, "UsedMemHigh", MemPoolAttrUsedMemHigh.String())
	assert.Equal(t, "MemPoolAttribute(0)", MemPoolAttribute(0).String())
	assert.Equal(t, "MemPoolAttribute(99)", MemPoolAttribute(99).String())
	assert.Equal(t, "MemPoolAttribute(-1)", MemPoolAttribute(-1).String())

	assert.Equal(t, "ComputeCapabilityMajor", DeviceAttrComputeCapabilityMajor.String())
	assert.Equal(t, "HostNUMAID", DeviceAttrHostNUMAID.String())
	assert.Equal(t, "GPUDirectRDMASupported", DeviceAttrGPUDirectRDMASupported.String())
	// Attributes without a constant keep their names.
	assert.Equal(t, "MaxThreadsPerBlock", DeviceAttribute(1).String())
	assert.Equal(t, "OnlyPartialHostNativeAtomicSupported", DeviceAttribute(147).String())
	assert.Equal(t, "DeviceAttribute(0)", DeviceAttribute(0).String())
	assert.Equal(t, "DeviceAttribute(100000)", DeviceAttribute(100000).String())
}

// The maps below tie every enumerator of the header to the Go constant that
// stands for it (deprecated aliases map to the current name's constant), so
// a constant missing from abi.go fails to compile and a value that drifted or
// an enumerator added to a newer header fails the test. Device attributes
// map to their Go names, most of which have no constant: the test finds each
// name's value from its place in deviceAttrNames.

var deviceAttrsByCName = map[string]string{
	"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK":                         "MaxThreadsPerBlock",
	"CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X":                               "MaxBlockDimX",
	"CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y":                               "MaxBlockDimY",
	"CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z":                               "MaxBlockDimZ",
	"CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X":                                "MaxGridDimX",
	"CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y":                                "MaxGridDimY",
	"CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z":                                "MaxGridDimZ",
	"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK":                   "MaxSharedMemoryPerBlock",
	"CU_DEVICE_ATTRIBUTE_SHARED_MEMORY_PER_BLOCK":                       "MaxSharedMemoryPerBlock",
	"CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY":                         "TotalConstantMemory",
	"CU_DEVICE_ATTRIBUTE_WARP_SIZE":                                     "WarpSize",
	"CU_DEVICE_ATTRIBUTE_MAX_PITCH":                                     "MaxPitch",
	"CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK":                       "MaxRegistersPerBlock",
	"CU_DEVICE_ATTRIBUTE_REGISTERS_PER_BLOCK":                           "MaxRegistersPerBlock",
	"CU_DEVICE_ATTRIBUTE_CLOCK_RATE":                                    "ClockRate",
	"CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT":                             "TextureAlignment",
	"CU_DEVICE_ATTRIBUTE_GPU_OVERLAP":                                   "GPUOverlap",
	"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT":                          "MultiprocessorCount",
	"CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT":                           "KernelExecTimeout",
	"CU_DEVICE_ATTRIBUTE_INTEGRATED":                                    "Integrated",
	"CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY":                           "CanMapHostMemory",
	"CU_DEVICE_ATTRIBUTE_COMPUTE_MODE":                                  "ComputeMode",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH":                       "MaximumTexture1DWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH":                       "MaximumTexture2DWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT":                      "MaximumTexture2DHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH":                       "MaximumTexture3DWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT":                      "MaximumTexture3DHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH":                       "MaximumTexture3DDepth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH":               "MaximumTexture2DLayeredWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT":              "MaximumTexture2DLayeredHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS":              "MaximumTexture2DLayeredLayers",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_ARRAY_WIDTH":                 "MaximumTexture2DLayeredWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_ARRAY_HEIGHT":                "MaximumTexture2DLayeredHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_ARRAY_NUMSLICES":             "MaximumTexture2DLayeredLayers",
	"CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT":                             "SurfaceAlignment",
	"CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS":                            "ConcurrentKernels",
	"CU_DEVICE_ATTRIBUTE_ECC_ENABLED":                                   "ECCEnabled",
	"CU_DEVICE_ATTRIBUTE_PCI_BUS_ID":                                    "PCIBusID",
	"CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID":                                 "PCIDeviceID",
	"CU_DEVICE_ATTRIBUTE_TCC_DRIVER":                                    "TCCDriver",
	"CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE":                             "MemoryClockRate",
	"CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH":                       "GlobalMemoryBusWidth",
	"CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE":                                 "L2CacheSize",
	"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR":                "MaxThreadsPerMultiprocessor",
	"CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT":                            "AsyncEngineCount",
	"CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING":                            "UnifiedAddressing",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH":               "MaximumTexture1DLayeredWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS":              "MaximumTexture1DLayeredLayers",
	"CU_DEVICE_ATTRIBUTE_CAN_TEX2D_GATHER":                              "CanTex2DGather",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH":                "MaximumTexture2DGatherWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT":               "MaximumTexture2DGatherHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE":             "MaximumTexture3DWidthAlternate",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE":            "MaximumTexture3DHeightAlternate",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE":             "MaximumTexture3DDepthAlternate",
	"CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID":                                 "PCIDomainID",
	"CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT":                       "TexturePitchAlignment",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH":                  "MaximumTextureCubemapWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH":          "MaximumTextureCubemapLayeredWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS":         "MaximumTextureCubemapLayeredLayers",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH":                       "MaximumSurface1DWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH":                       "MaximumSurface2DWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT":                      "MaximumSurface2DHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH":                       "MaximumSurface3DWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT":                      "MaximumSurface3DHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH":                       "MaximumSurface3DDepth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH":               "MaximumSurface1DLayeredWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS":              "MaximumSurface1DLayeredLayers",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH":               "MaximumSurface2DLayeredWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT":              "MaximumSurface2DLayeredHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS":              "MaximumSurface2DLayeredLayers",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH":                  "MaximumSurfaceCubemapWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH":          "MaximumSurfaceCubemapLayeredWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS":         "MaximumSurfaceCubemapLayeredLayers",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH":                "MaximumTexture1DLinearWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH":                "MaximumTexture2DLinearWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT":               "MaximumTexture2DLinearHeight",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH":                "MaximumTexture2DLinearPitch",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH":             "MaximumTexture2DMipmappedWidth",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT":            "MaximumTexture2DMipmappedHeight",
	"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR":                      "ComputeCapabilityMajor",
	"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR":                      "ComputeCapabilityMinor",
	"CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH":             "MaximumTexture1DMipmappedWidth",
	"CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED":                   "StreamPrioritiesSupported",
	"CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED":                     "GlobalL1CacheSupported",
	"CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED":                      "LocalL1CacheSupported",
	"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR":          "MaxSharedMemoryPerMultiprocessor",
	"CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR":              "MaxRegistersPerMultiprocessor",
	"CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY":                                "ManagedMemory",
	"CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD":                               "MultiGPUBoard",
	"CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID":                      "MultiGPUBoardGroupID",
	"CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED":                  "HostNativeAtomicSupported",
	"CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO":         "SingleToDoublePrecisionPerfRatio",
	"CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS":                        "PageableMemoryAccess",
	"CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS":                     "ConcurrentManagedAccess",
	"CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED":                  "ComputePreemptionSupported",
	"CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM":       "CanUseHostPointerForRegisteredMem",
	"CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1":                     "CanUseStreamMemOpsV1",
	"CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1":              "CanUse64BitStreamMemOpsV1",
	"CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1":              "CanUseStreamWaitValueNORV1",
	"CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH":                            "CooperativeLaunch",
	"CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH":               "CooperativeMultiDeviceLaunch",
	"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN":             "MaxSharedMemoryPerBlockOptin",
	"CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES":                       "CanFlushRemoteWrites",
	"CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED":                       "HostRegisterSupported",
	"CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES":  "PageableMemoryAccessUsesHostPageTables",
	"CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST":           "DirectManagedMemAccessFromHost",
	"CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED":          "VirtualMemoryManagementSupported",
	"CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED":           "VirtualMemoryManagementSupported",
	"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED":   "HandleTypePosixFileDescriptorSupported",
	"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED":            "HandleTypeWin32HandleSupported",
	"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED":        "HandleTypeWin32KMTHandleSupported",
	"CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR":                 "MaxBlocksPerMultiprocessor",
	"CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED":                 "GenericCompressionSupported",
	"CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE":                  "MaxPersistingL2CacheSize",
	"CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE":                 "MaxAccessPolicyWindowSize",
	"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED":       "GPUDirectRDMAWithCUDAVMMSupported",
	"CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK":              "ReservedSharedMemoryPerBlock",
	"CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED":                   "SparseCUDAArraySupported",
	"CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED":             "ReadOnlyHostRegisterSupported",
	"CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED":          "TimelineSemaphoreInteropSupported",
	"CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED":                        "MemoryPoolsSupported",
	"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED":                     "GPUDirectRDMASupported",
	"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS":          "GPUDirectRDMAFlushWritesOptions",
	"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING":               "GPUDirectRDMAWritesOrdering",
	"CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES":                "MemPoolSupportedHandleTypes",
	"CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH":                                "ClusterLaunch",
	"CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED":         "DeferredMappingCUDAArraySupported",
	"CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS":                 "CanUse64BitStreamMemOps",
	"CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR":                 "CanUseStreamWaitValueNOR",
	"CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED":                             "DMABufSupported",
	"CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED":                           "IPCEventSupported",
	"CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT":                         "MemSyncDomainCount",
	"CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED":                   "TensorMapAccessSupported",
	"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED":                  "HandleTypeFabricSupported",
	"CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS":                     "UnifiedFunctionPointers",
	"CU_DEVICE_ATTRIBUTE_NUMA_CONFIG":                                   "NUMAConfig",
	"CU_DEVICE_ATTRIBUTE_NUMA_ID":                                       "NUMAID",
	"CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED":                           "MulticastSupported",
	"CU_DEVICE_ATTRIBUTE_MPS_ENABLED":                                   "MPSEnabled",
	"CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID":                                  "HostNUMAID",
	"CU_DEVICE_ATTRIBUTE_D3D12_CIG_SUPPORTED":                           "D3D12CIGSupported",
	"CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK":                 "MemDecompressAlgorithmMask",
	"CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_MAXIMUM_LENGTH":                 "MemDecompressMaximumLength",
	"CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED":                          "VulkanCIGSupported",
	"CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID":                             "GPUPCIDeviceID",
	"CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID":                          "GPUPCISubsystemID",
	"CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": "HostNUMAVirtualMemoryManagementSupported",
	"CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED":              "HostNUMAMemoryPoolsSupported",
	"CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED":             "HostNUMAMultinodeIPCSupported",
	"CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED":                   "HostMemoryPoolsSupported",
	"CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED":      "HostVirtualMemoryManagementSupported",
	"CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED":                  "HostAllocDMABufSupported",
	"CU_DEVICE_ATTRIBUTE_ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED":     "OnlyPartialHostNativeAtomicSupported",
}

// pointerAttrsByCName names only the attributes QueryPointer reads; the
// header test checks their values.
var pointerAttrsByCName = map[string]pointerAttr{
	"CU_POINTER_ATTRIBUTE_MEMORY_TYPE":      pointerAttrMemoryType,
	"CU_POINTER_ATTRIBUTE_IS_MANAGED":       pointerAttrIsManaged,
	"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL":   pointerAttrDeviceOrdinal,
	"CU_POINTER_ATTRIBUTE_RANGE_START_ADDR": pointerAttrRangeStartAddr,
	"CU_POINTER_ATTRIBUTE_RANGE_SIZE":       pointerAttrRangeSize,
	"CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE":   pointerAttrMemPoolHandle,
}

var memPoolAttrsByCName = map[string]MemPoolAttribute{
	"CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES":   MemPoolAttrReuseFollowEventDependencies,
	"CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC":         MemPoolAttrReuseAllowOpportunistic,
	"CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES": MemPoolAttrReuseAllowInternalDependencies,
	"CU_MEMPOOL_ATTR_RELEASE_THRESHOLD":                 MemPoolAttrReleaseThreshold,
	"CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT":              MemPoolAttrReservedMemCurrent,
	"CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH":                 MemPoolAttrReservedMemHigh,
	"CU_MEMPOOL_ATTR_USED_MEM_CURRENT":                  MemPoolAttrUsedMemCurrent,
	"CU_MEMPOOL_ATTR_USED_MEM_HIGH":                     MemPoolAttrUsedMemHigh,
}

func TestEnumsMatchHeader(t *testing.T) {
	header := readHeader(t)
	for _, tc := range []struct {
		tag    string
		prefix string
		goVals map[string]int64
		str    func(int64) string
		goName string
	}{
		{"CUdevice_attribute_enum", "CU_DEVICE_ATTRIBUTE_", deviceAttrValues(),
			func(v int64) string { return DeviceAttribute(v).String() }, "DeviceAttribute"},
		{"CUmemPool_attribute_enum", "CU_MEMPOOL_ATTR_", toInt64(memPoolAttrsByCName),
			func(v int64) string { return MemPoolAttribute(v).String() }, "MemPoolAttribute"},
	} {
		t.Run(tc.goName, func(t *testing.T) {
			seen := make(map[string]bool)
			for _, c := range headerEnum(t, header, tc.tag) {
				if c.name == tc.prefix+"MAX" {
					continue // sentinel, not an attribute
				}
				seen[c.name] = true
				v, ok := tc.goVals[c.name]
				if !assert.True(t, ok, "%s = %d has no Go constant", c.name, c.value) {
					continue
				}
				assert.Equal(t, c.value, v, c.name)
				assert.NotRegexp(t, `\(`, tc.str(c.value), "%s(%d) has no String name", tc.goName, c.value)
			}
			for name := range tc.goVals {
				assert.True(t, seen[name], "%s is not in the header", name)
			}
		})
	}

	// The pointer attributes QueryPointer reads, by value.
	ptrAttrs := make(map[string]int64)
	for _, c := range headerEnum(t, header, "CUpointer_attribute_enum") {
		ptrAttrs[c.name] = c.value
	}
	for name, v := range pointerAttrsByCName {
		assert.Equal(t, ptrAttrs[name], int64(v), name)
	}

	// The remaining enums, compared by value.
	for _, tc := range []struct {
		tag  string
		want map[string]int64
	}{
		{"cudaError_enum", nil}, // covered by TestResultTableMatchesHeader
		{"CUmemLocationType_enum", map[string]int64{
			"CU_MEM_LOCATION_TYPE_INVALID": int64(MemLocationTypeInvalid), "CU_MEM_LOCATION_TYPE_NONE": int64(MemLocationTypeNone),
			"CU_MEM_LOCATION_TYPE_DEVICE": int64(MemLocationTypeDevice), "CU_MEM_LOCATION_TYPE_HOST": int64(MemLocationTypeHost),
			"CU_MEM_LOCATION_TYPE_HOST_NUMA":         int64(MemLocationTypeHostNUMA),
			"CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT": int64(MemLocationTypeHostNUMACurrent),
		}},
		{"CUmemAllocationType_enum", map[string]int64{
			"CU_MEM_ALLOCATION_TYPE_INVALID": int64(MemAllocationTypeInvalid), "CU_MEM_ALLOCATION_TYPE_PINNED": int64(MemAllocationTypePinned),
			"CU_MEM_ALLOCATION_TYPE_MANAGED": int64(MemAllocationTypeManaged),
		}},
		{"CUmemAllocationHandleType_enum", map[string]int64{
			"CU_MEM_HANDLE_TYPE_NONE": int64(MemHandleTypeNone), "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR": int64(MemHandleTypePosixFileDescriptor),
			"CU_MEM_HANDLE_TYPE_WIN32": int64(MemHandleTypeWin32), "CU_MEM_HANDLE_TYPE_WIN32_KMT": int64(MemHandleTypeWin32KMT),
			"CU_MEM_HANDLE_TYPE_FABRIC": int64(MemHandleTypeFabric),
		}},
		{"CUmemAccess_flags_enum", map[string]int64{
			"CU_MEM_ACCESS_FLAGS_PROT_NONE": int64(MemAccessProtNone), "CU_MEM_ACCESS_FLAGS_PROT_READ": int64(MemAccessProtRead),
			"CU_MEM_ACCESS_FLAGS_PROT_READWRITE": int64(MemAccessProtReadWrite),
		}},
		{"CUmemAllocationGranularity_flags_enum", map[string]int64{
			"CU_MEM_ALLOC_GRANULARITY_MINIMUM":     int64(MemAllocationGranularityMinimum),
			"CU_MEM_ALLOC_GRANULARITY_RECOMMENDED": int64(MemAllocationGranularityRecommended),
		}},
		{"CUmemAllocationCompType_enum", map[string]int64{
			"CU_MEM_ALLOCATION_COMP_NONE": int64(MemAllocationCompNone), "CU_MEM_ALLOCATION_COMP_GENERIC": int64(MemAllocationCompGeneric),
		}},
		{"CUmem_advise_enum", map[string]int64{
			"CU_MEM_ADVISE_SET_READ_MOSTLY": int64(MemAdviseSetReadMostly), "CU_MEM_ADVISE_UNSET_READ_MOSTLY": int64(MemAdviseUnsetReadMostly),
			"CU_MEM_ADVISE_SET_PREFERRED_LOCATION":   int64(MemAdviseSetPreferredLocation),
			"CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION": int64(MemAdviseUnsetPreferredLocation),
			"CU_MEM_ADVISE_SET_ACCESSED_BY":          int64(MemAdviseSetAccessedBy), "CU_MEM_ADVISE_UNSET_ACCESSED_BY": int64(MemAdviseUnsetAccessedBy),
		}},
		{"CUmemAttach_flags_enum", map[string]int64{
			"CU_MEM_ATTACH_GLOBAL": int64(MemAttachGlobal), "CU_MEM_ATTACH_HOST": int64(MemAttachHost), "CU_MEM_ATTACH_SINGLE": int64(MemAttachSingle),
		}},
		{"CUmemorytype_enum", map[string]int64{
			"CU_MEMORYTYPE_HOST": int64(MemoryTypeHost), "CU_MEMORYTYPE_DEVICE": int64(MemoryTypeDevice),
			"CU_MEMORYTYPE_ARRAY": int64(MemoryTypeArray), "CU_MEMORYTYPE_UNIFIED": int64(MemoryTypeUnified),
		}},
		{"CUstream_flags_enum", map[string]int64{
			"CU_STREAM_DEFAULT": int64(StreamDefault), "CU_STREAM_NON_BLOCKING": int64(StreamNonBlocking),
		}},
		{"CUevent_flags_enum", map[string]int64{
			"CU_EVENT_DEFAULT": int64(EventDefault), "CU_EVENT_BLOCKING_SYNC": int64(EventBlockingSync),
			"CU_EVENT_DISABLE_TIMING": int64(EventDisableTiming), "CU_EVENT_INTERPROCESS": int64(EventInterprocess),
		}},
		{"CUipcMem_flags_enum", map[string]int64{
			"CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS": int64(IPCMemLazyEnablePeerAccess),
		}},
	} {
		if tc.want == nil {
			continue
		}
		t.Run(tc.tag, func(t *testing.T) {
			got := make(map[string]int64)
			for _, c := range headerEnum(t, header, tc.tag) {
				if strings.HasSuffix(c.name, "_MAX") {
					continue
				}
				got[c.name] = c.value
			}
			assert.Equal(t, tc.want, got)
		})
	}

	// #define'd flags, which are not enums.
	for name, want := range map[string]int64{
		"CU_IPC_HANDLE_SIZE":                     IPCHandleSize,
		"CU_MEMHOSTALLOC_PORTABLE":               int64(MemHostAllocPortable),
		"CU_MEMHOSTALLOC_DEVICEMAP":              int64(MemHostAllocDeviceMap),
		"CU_MEMHOSTALLOC_WRITECOMBINED":          int64(MemHostAllocWriteCombined),
		"CU_MEMHOSTREGISTER_PORTABLE":            int64(MemHostRegisterPortable),
		"CU_MEMHOSTREGISTER_DEVICEMAP":           int64(MemHostRegisterDeviceMap),
		"CU_MEMHOSTREGISTER_IOMEMORY":            int64(MemHostRegisterIOMemory),
		"CU_MEMHOSTREGISTER_READ_ONLY":           int64(MemHostRegisterReadOnly),
		"CU_MEM_CREATE_USAGE_TILE_POOL":          MemCreateUsageTilePool,
		"CU_MEM_CREATE_USAGE_HW_DECOMPRESS":      MemCreateUsageHWDecompress,
		"CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS": MemPoolCreateUsageHWDecompress,
	} {
		m := regexp.MustCompile(`(?m)^#define\s+` + name + `\s+(\S+)`).FindStringSubmatch(header)
		if !assert.NotNil(t, m, "#define %s not found", name) {
			continue
		}
		assert.Equal(t, want, evalEnumExpr(t, m[1]), name)
	}
}

// deviceAttrValues maps each C name of deviceAttrsByCName to the value
// deviceAttrNames gives its Go name, or to 0 when the table lacks the name.
func deviceAttrValues() map[string]int64 {
	out := make(map[string]int64, len(deviceAttrsByCName))
	for c, name := range deviceAttrsByCName {
		out[c] = int64(slices.Index(deviceAttrNames, name) + 1)
	}
	return out
}

func toInt64[T ~int32](m map[string]T) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = int64(v)
	}
	return out
}

// The packed name tables of abi.go list, in value order, each constant's
// own name without its prefix: the value of every constant of the type, read
// from the source, names it. The memory pool table has no name left over; the
// device attribute table also names the attributes without a constant.
func TestEnumNameTablesMatchConstants(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "abi.go", nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	for _, tc := range []struct {
		typ, prefix string
		names       []string
		str         func(int64) string
		all         bool // every name of the table has a constant
	}{
		{"DeviceAttribute", "DeviceAttr", deviceAttrNames, func(v int64) string { return DeviceAttribute(v).String() }, false},
		{"MemPoolAttribute", "MemPoolAttr", memPoolAttrNames, func(v int64) string { return MemPoolAttribute(v).String() }, true},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			n := 0
			ast.Inspect(f, func(node ast.Node) bool {
				vs, ok := node.(*ast.ValueSpec)
				if !ok || len(vs.Values) != 1 || fmt.Sprint(vs.Type) != tc.typ {
					return true
				}
				v, err := strconv.ParseInt(vs.Values[0].(*ast.BasicLit).Value, 0, 64)
				require.NoError(t, err)
				assert.Equal(t, tc.prefix+tc.str(v), vs.Names[0].Name, "String of value %d", v)
				n++
				return true
			})
			if tc.all {
				assert.Equal(t, len(tc.names), n, "names in the table and constants in the source")
			} else {
				assert.Positive(t, n, "constants in the source")
			}
		})
	}
	assert.Equal(t, "DeviceAttribute(0)", DeviceAttribute(0).String())
	assert.Equal(t, "DeviceAttribute(148)", DeviceAttribute(len(deviceAttrNames)+1).String())
}
