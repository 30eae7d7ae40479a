package cuda

import (
	"cmp"
	"slices"
	"strconv"
)

// Result is a CUresult, the status code every driver entry point returns.
// Non-zero values implement error; match them with errors.Is. Only the codes
// a caller of this module plausibly tests for are named here; every other
// code the driver defines still prints its C name (see [Result.Name]), and
// Result(n) matches any code by value.
type Result int32

// Driver result codes, with the values of the CUDA 13.0 driver API.
const (
	Success                       Result = 0
	ErrorInvalidValue             Result = 1
	ErrorOutOfMemory              Result = 2
	ErrorNotInitialized           Result = 3
	ErrorDeinitialized            Result = 4
	ErrorNoDevice                 Result = 100
	ErrorInvalidDevice            Result = 101
	ErrorInvalidContext           Result = 201
	ErrorInvalidHandle            Result = 400
	ErrorIllegalState             Result = 401
	ErrorNotFound                 Result = 500
	ErrorNotReady                 Result = 600
	ErrorIllegalAddress           Result = 700
	ErrorPeerAccessAlreadyEnabled Result = 704
	ErrorPeerAccessNotEnabled     Result = 705
	ErrorContextIsDestroyed       Result = 709
	ErrorLaunchFailed             Result = 719
	ErrorNotPermitted             Result = 800
	ErrorNotSupported             Result = 801
	ErrorStreamCaptureUnsupported Result = 900
	ErrorStreamCaptureInvalidated Result = 901
	ErrorStreamCaptureImplicit    Result = 906
	ErrorUnknown                  Result = 999
)

// resultName pairs a code with its C name.
type resultName struct {
	code Result
	name string
}

// resultNames lists every code of the CUDA 13.0 driver API with its C name,
// sorted by code so Name can binary-search it. It needs no driver.
var resultNames = [...]resultName{
	{0, "CUDA_SUCCESS"},
	{1, "CUDA_ERROR_INVALID_VALUE"},
	{2, "CUDA_ERROR_OUT_OF_MEMORY"},
	{3, "CUDA_ERROR_NOT_INITIALIZED"},
	{4, "CUDA_ERROR_DEINITIALIZED"},
	{5, "CUDA_ERROR_PROFILER_DISABLED"},
	{6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"},
	{7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"},
	{8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"},
	{34, "CUDA_ERROR_STUB_LIBRARY"},
	{36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
	{46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
	{100, "CUDA_ERROR_NO_DEVICE"},
	{101, "CUDA_ERROR_INVALID_DEVICE"},
	{102, "CUDA_ERROR_DEVICE_NOT_LICENSED"},
	{200, "CUDA_ERROR_INVALID_IMAGE"},
	{201, "CUDA_ERROR_INVALID_CONTEXT"},
	{202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"},
	{205, "CUDA_ERROR_MAP_FAILED"},
	{206, "CUDA_ERROR_UNMAP_FAILED"},
	{207, "CUDA_ERROR_ARRAY_IS_MAPPED"},
	{208, "CUDA_ERROR_ALREADY_MAPPED"},
	{209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
	{210, "CUDA_ERROR_ALREADY_ACQUIRED"},
	{211, "CUDA_ERROR_NOT_MAPPED"},
	{212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"},
	{213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"},
	{214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
	{215, "CUDA_ERROR_UNSUPPORTED_LIMIT"},
	{216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"},
	{217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
	{218, "CUDA_ERROR_INVALID_PTX"},
	{219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"},
	{220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"},
	{221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"},
	{222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
	{223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"},
	{224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"},
	{225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"},
	{226, "CUDA_ERROR_CONTAINED"},
	{300, "CUDA_ERROR_INVALID_SOURCE"},
	{301, "CUDA_ERROR_FILE_NOT_FOUND"},
	{302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"},
	{303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"},
	{304, "CUDA_ERROR_OPERATING_SYSTEM"},
	{400, "CUDA_ERROR_INVALID_HANDLE"},
	{401, "CUDA_ERROR_ILLEGAL_STATE"},
	{402, "CUDA_ERROR_LOSSY_QUERY"},
	{500, "CUDA_ERROR_NOT_FOUND"},
	{600, "CUDA_ERROR_NOT_READY"},
	{700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
	{701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
	{702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
	{703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"},
	{704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
	{705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"},
	{708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"},
	{709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
	{710, "CUDA_ERROR_ASSERT"},
	{711, "CUDA_ERROR_TOO_MANY_PEERS"},
	{712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
	{713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
	{714, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
	{715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
	{716, "CUDA_ERROR_MISALIGNED_ADDRESS"},
	{717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
	{718, "CUDA_ERROR_INVALID_PC"},
	{719, "CUDA_ERROR_LAUNCH_FAILED"},
	{720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"},
	{721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"},
	{800, "CUDA_ERROR_NOT_PERMITTED"},
	{801, "CUDA_ERROR_NOT_SUPPORTED"},
	{802, "CUDA_ERROR_SYSTEM_NOT_READY"},
	{803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
	{804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
	{805, "CUDA_ERROR_MPS_CONNECTION_FAILED"},
	{806, "CUDA_ERROR_MPS_RPC_FAILURE"},
	{807, "CUDA_ERROR_MPS_SERVER_NOT_READY"},
	{808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"},
	{809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"},
	{810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"},
	{811, "CUDA_ERROR_CDP_NOT_SUPPORTED"},
	{812, "CUDA_ERROR_CDP_VERSION_MISMATCH"},
	{900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
	{901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
	{902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"},
	{903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"},
	{904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"},
	{905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"},
	{906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"},
	{907, "CUDA_ERROR_CAPTURED_EVENT"},
	{908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"},
	{909, "CUDA_ERROR_TIMEOUT"},
	{910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"},
	{911, "CUDA_ERROR_EXTERNAL_DEVICE"},
	{912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"},
	{913, "CUDA_ERROR_FUNCTION_NOT_LOADED"},
	{914, "CUDA_ERROR_INVALID_RESOURCE_TYPE"},
	{915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"},
	{916, "CUDA_ERROR_KEY_ROTATION"},
	{999, "CUDA_ERROR_UNKNOWN"},
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
