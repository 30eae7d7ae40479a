package cuda

import (
	"cmp"
	"slices"
	"strconv"
)

// Result is a CUresult, the status code every driver entry point returns.
// Non-zero values implement error; match them with errors.Is.
type Result int32

// Driver result codes, with the values of the CUDA 13.0 driver API.
const (
	Success                           Result = 0
	ErrorInvalidValue                 Result = 1
	ErrorOutOfMemory                  Result = 2
	ErrorNotInitialized               Result = 3
	ErrorDeinitialized                Result = 4
	ErrorProfilerDisabled             Result = 5
	ErrorProfilerNotInitialized       Result = 6
	ErrorProfilerAlreadyStarted       Result = 7
	ErrorProfilerAlreadyStopped       Result = 8
	ErrorStubLibrary                  Result = 34
	ErrorCallRequiresNewerDriver      Result = 36
	ErrorDeviceUnavailable            Result = 46
	ErrorNoDevice                     Result = 100
	ErrorInvalidDevice                Result = 101
	ErrorDeviceNotLicensed            Result = 102
	ErrorInvalidImage                 Result = 200
	ErrorInvalidContext               Result = 201
	ErrorContextAlreadyCurrent        Result = 202
	ErrorMapFailed                    Result = 205
	ErrorUnmapFailed                  Result = 206
	ErrorArrayIsMapped                Result = 207
	ErrorAlreadyMapped                Result = 208
	ErrorNoBinaryForGPU               Result = 209
	ErrorAlreadyAcquired              Result = 210
	ErrorNotMapped                    Result = 211
	ErrorNotMappedAsArray             Result = 212
	ErrorNotMappedAsPointer           Result = 213
	ErrorECCUncorrectable             Result = 214
	ErrorUnsupportedLimit             Result = 215
	ErrorContextAlreadyInUse          Result = 216
	ErrorPeerAccessUnsupported        Result = 217
	ErrorInvalidPTX                   Result = 218
	ErrorInvalidGraphicsContext       Result = 219
	ErrorNVLinkUncorrectable          Result = 220
	ErrorJITCompilerNotFound          Result = 221
	ErrorUnsupportedPTXVersion        Result = 222
	ErrorJITCompilationDisabled       Result = 223
	ErrorUnsupportedExecAffinity      Result = 224
	ErrorUnsupportedDevSideSync       Result = 225
	ErrorContained                    Result = 226
	ErrorInvalidSource                Result = 300
	ErrorFileNotFound                 Result = 301
	ErrorSharedObjectSymbolNotFound   Result = 302
	ErrorSharedObjectInitFailed       Result = 303
	ErrorOperatingSystem              Result = 304
	ErrorInvalidHandle                Result = 400
	ErrorIllegalState                 Result = 401
	ErrorLossyQuery                   Result = 402
	ErrorNotFound                     Result = 500
	ErrorNotReady                     Result = 600
	ErrorIllegalAddress               Result = 700
	ErrorLaunchOutOfResources         Result = 701
	ErrorLaunchTimeout                Result = 702
	ErrorLaunchIncompatibleTexturing  Result = 703
	ErrorPeerAccessAlreadyEnabled     Result = 704
	ErrorPeerAccessNotEnabled         Result = 705
	ErrorPrimaryContextActive         Result = 708
	ErrorContextIsDestroyed           Result = 709
	ErrorAssert                       Result = 710
	ErrorTooManyPeers                 Result = 711
	ErrorHostMemoryAlreadyRegistered  Result = 712
	ErrorHostMemoryNotRegistered      Result = 713
	ErrorHardwareStackError           Result = 714
	ErrorIllegalInstruction           Result = 715
	ErrorMisalignedAddress            Result = 716
	ErrorInvalidAddressSpace          Result = 717
	ErrorInvalidPC                    Result = 718
	ErrorLaunchFailed                 Result = 719
	ErrorCooperativeLaunchTooLarge    Result = 720
	ErrorTensorMemoryLeak             Result = 721
	ErrorNotPermitted                 Result = 800
	ErrorNotSupported                 Result = 801
	ErrorSystemNotReady               Result = 802
	ErrorSystemDriverMismatch         Result = 803
	ErrorCompatNotSupportedOnDevice   Result = 804
	ErrorMPSConnectionFailed          Result = 805
	ErrorMPSRPCFailure                Result = 806
	ErrorMPSServerNotReady            Result = 807
	ErrorMPSMaxClientsReached         Result = 808
	ErrorMPSMaxConnectionsReached     Result = 809
	ErrorMPSClientTerminated          Result = 810
	ErrorCDPNotSupported              Result = 811
	ErrorCDPVersionMismatch           Result = 812
	ErrorStreamCaptureUnsupported     Result = 900
	ErrorStreamCaptureInvalidated     Result = 901
	ErrorStreamCaptureMerge           Result = 902
	ErrorStreamCaptureUnmatched       Result = 903
	ErrorStreamCaptureUnjoined        Result = 904
	ErrorStreamCaptureIsolation       Result = 905
	ErrorStreamCaptureImplicit        Result = 906
	ErrorCapturedEvent                Result = 907
	ErrorStreamCaptureWrongThread     Result = 908
	ErrorTimeout                      Result = 909
	ErrorGraphExecUpdateFailure       Result = 910
	ErrorExternalDevice               Result = 911
	ErrorInvalidClusterSize           Result = 912
	ErrorFunctionNotLoaded            Result = 913
	ErrorInvalidResourceType          Result = 914
	ErrorInvalidResourceConfiguration Result = 915
	ErrorKeyRotation                  Result = 916
	ErrorUnknown                      Result = 999
)

// resultName pairs a code with its C name.
type resultName struct {
	code Result
	name string
}

// resultNames lists every code above with its C name, sorted by code so Name
// can binary-search it. It needs no driver.
var resultNames = [...]resultName{
	{Success, "CUDA_SUCCESS"},
	{ErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE"},
	{ErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY"},
	{ErrorNotInitialized, "CUDA_ERROR_NOT_INITIALIZED"},
	{ErrorDeinitialized, "CUDA_ERROR_DEINITIALIZED"},
	{ErrorProfilerDisabled, "CUDA_ERROR_PROFILER_DISABLED"},
	{ErrorProfilerNotInitialized, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"},
	{ErrorProfilerAlreadyStarted, "CUDA_ERROR_PROFILER_ALREADY_STARTED"},
	{ErrorProfilerAlreadyStopped, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"},
	{ErrorStubLibrary, "CUDA_ERROR_STUB_LIBRARY"},
	{ErrorCallRequiresNewerDriver, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
	{ErrorDeviceUnavailable, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
	{ErrorNoDevice, "CUDA_ERROR_NO_DEVICE"},
	{ErrorInvalidDevice, "CUDA_ERROR_INVALID_DEVICE"},
	{ErrorDeviceNotLicensed, "CUDA_ERROR_DEVICE_NOT_LICENSED"},
	{ErrorInvalidImage, "CUDA_ERROR_INVALID_IMAGE"},
	{ErrorInvalidContext, "CUDA_ERROR_INVALID_CONTEXT"},
	{ErrorContextAlreadyCurrent, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"},
	{ErrorMapFailed, "CUDA_ERROR_MAP_FAILED"},
	{ErrorUnmapFailed, "CUDA_ERROR_UNMAP_FAILED"},
	{ErrorArrayIsMapped, "CUDA_ERROR_ARRAY_IS_MAPPED"},
	{ErrorAlreadyMapped, "CUDA_ERROR_ALREADY_MAPPED"},
	{ErrorNoBinaryForGPU, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
	{ErrorAlreadyAcquired, "CUDA_ERROR_ALREADY_ACQUIRED"},
	{ErrorNotMapped, "CUDA_ERROR_NOT_MAPPED"},
	{ErrorNotMappedAsArray, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"},
	{ErrorNotMappedAsPointer, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"},
	{ErrorECCUncorrectable, "CUDA_ERROR_ECC_UNCORRECTABLE"},
	{ErrorUnsupportedLimit, "CUDA_ERROR_UNSUPPORTED_LIMIT"},
	{ErrorContextAlreadyInUse, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"},
	{ErrorPeerAccessUnsupported, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
	{ErrorInvalidPTX, "CUDA_ERROR_INVALID_PTX"},
	{ErrorInvalidGraphicsContext, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"},
	{ErrorNVLinkUncorrectable, "CUDA_ERROR_NVLINK_UNCORRECTABLE"},
	{ErrorJITCompilerNotFound, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"},
	{ErrorUnsupportedPTXVersion, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
	{ErrorJITCompilationDisabled, "CUDA_ERROR_JIT_COMPILATION_DISABLED"},
	{ErrorUnsupportedExecAffinity, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"},
	{ErrorUnsupportedDevSideSync, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"},
	{ErrorContained, "CUDA_ERROR_CONTAINED"},
	{ErrorInvalidSource, "CUDA_ERROR_INVALID_SOURCE"},
	{ErrorFileNotFound, "CUDA_ERROR_FILE_NOT_FOUND"},
	{ErrorSharedObjectSymbolNotFound, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"},
	{ErrorSharedObjectInitFailed, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"},
	{ErrorOperatingSystem, "CUDA_ERROR_OPERATING_SYSTEM"},
	{ErrorInvalidHandle, "CUDA_ERROR_INVALID_HANDLE"},
	{ErrorIllegalState, "CUDA_ERROR_ILLEGAL_STATE"},
	{ErrorLossyQuery, "CUDA_ERROR_LOSSY_QUERY"},
	{ErrorNotFound, "CUDA_ERROR_NOT_FOUND"},
	{ErrorNotReady, "CUDA_ERROR_NOT_READY"},
	{ErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS"},
	{ErrorLaunchOutOfResources, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
	{ErrorLaunchTimeout, "CUDA_ERROR_LAUNCH_TIMEOUT"},
	{ErrorLaunchIncompatibleTexturing, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"},
	{ErrorPeerAccessAlreadyEnabled, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
	{ErrorPeerAccessNotEnabled, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"},
	{ErrorPrimaryContextActive, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"},
	{ErrorContextIsDestroyed, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
	{ErrorAssert, "CUDA_ERROR_ASSERT"},
	{ErrorTooManyPeers, "CUDA_ERROR_TOO_MANY_PEERS"},
	{ErrorHostMemoryAlreadyRegistered, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
	{ErrorHostMemoryNotRegistered, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
	{ErrorHardwareStackError, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
	{ErrorIllegalInstruction, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
	{ErrorMisalignedAddress, "CUDA_ERROR_MISALIGNED_ADDRESS"},
	{ErrorInvalidAddressSpace, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
	{ErrorInvalidPC, "CUDA_ERROR_INVALID_PC"},
	{ErrorLaunchFailed, "CUDA_ERROR_LAUNCH_FAILED"},
	{ErrorCooperativeLaunchTooLarge, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"},
	{ErrorTensorMemoryLeak, "CUDA_ERROR_TENSOR_MEMORY_LEAK"},
	{ErrorNotPermitted, "CUDA_ERROR_NOT_PERMITTED"},
	{ErrorNotSupported, "CUDA_ERROR_NOT_SUPPORTED"},
	{ErrorSystemNotReady, "CUDA_ERROR_SYSTEM_NOT_READY"},
	{ErrorSystemDriverMismatch, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
	{ErrorCompatNotSupportedOnDevice, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
	{ErrorMPSConnectionFailed, "CUDA_ERROR_MPS_CONNECTION_FAILED"},
	{ErrorMPSRPCFailure, "CUDA_ERROR_MPS_RPC_FAILURE"},
	{ErrorMPSServerNotReady, "CUDA_ERROR_MPS_SERVER_NOT_READY"},
	{ErrorMPSMaxClientsReached, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"},
	{ErrorMPSMaxConnectionsReached, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"},
	{ErrorMPSClientTerminated, "CUDA_ERROR_MPS_CLIENT_TERMINATED"},
	{ErrorCDPNotSupported, "CUDA_ERROR_CDP_NOT_SUPPORTED"},
	{ErrorCDPVersionMismatch, "CUDA_ERROR_CDP_VERSION_MISMATCH"},
	{ErrorStreamCaptureUnsupported, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
	{ErrorStreamCaptureInvalidated, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
	{ErrorStreamCaptureMerge, "CUDA_ERROR_STREAM_CAPTURE_MERGE"},
	{ErrorStreamCaptureUnmatched, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"},
	{ErrorStreamCaptureUnjoined, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"},
	{ErrorStreamCaptureIsolation, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"},
	{ErrorStreamCaptureImplicit, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"},
	{ErrorCapturedEvent, "CUDA_ERROR_CAPTURED_EVENT"},
	{ErrorStreamCaptureWrongThread, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"},
	{ErrorTimeout, "CUDA_ERROR_TIMEOUT"},
	{ErrorGraphExecUpdateFailure, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"},
	{ErrorExternalDevice, "CUDA_ERROR_EXTERNAL_DEVICE"},
	{ErrorInvalidClusterSize, "CUDA_ERROR_INVALID_CLUSTER_SIZE"},
	{ErrorFunctionNotLoaded, "CUDA_ERROR_FUNCTION_NOT_LOADED"},
	{ErrorInvalidResourceType, "CUDA_ERROR_INVALID_RESOURCE_TYPE"},
	{ErrorInvalidResourceConfiguration, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"},
	{ErrorKeyRotation, "CUDA_ERROR_KEY_ROTATION"},
	{ErrorUnknown, "CUDA_ERROR_UNKNOWN"},
}

// Name returns the C name of r, such as "CUDA_ERROR_OUT_OF_MEMORY", or "" when
// r is not a code this package knows.
func (r Result) Name() string {
	i, ok := slices.BinarySearchFunc(resultNames[:], r, func(e resultName, r Result) int {
		return cmp.Compare(e.code, r)
	})
	if !ok {
		return ""
	}
	return resultNames[i].name
}

// Error returns the C name of r, or "CUresult(N)" for a code this package does
// not know. It carries no "cuda: " prefix; OpError adds the failing operation.
func (r Result) Error() string {
	if n := r.Name(); n != "" {
		return n
	}
	return "CUresult(" + strconv.Itoa(int(r)) + ")"
}

// Is reports whether r matches target beyond plain equality:
// ErrorNotSupported matches ErrNotSupported, so errors.Is(err, ErrNotSupported)
// covers the driver saying no as well as the checks this module makes itself.
func (r Result) Is(target error) bool {
	return target == ErrNotSupported && r == ErrorNotSupported
}
