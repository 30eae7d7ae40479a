package cuda

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// headerPath is where the CUDA driver header sits relative to this package
// in a checkout laid out like the project's workspace. Tests that compare
// against it skip when it is absent; the committed tables never need it.
const headerPath = "../../shared/reference/cuda.h"

// headerConst is one enumerator of a C enum.
type headerConst struct {
	name  string
	value int64
}

// readHeader returns the header text, or skips the test when it is absent.
func readHeader(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(headerPath)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("%s not present; skipping comparison with the C header", headerPath)
	}
	require.NoError(t, err)
	return string(b)
}

var (
	blockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	lineComment  = regexp.MustCompile(`//[^\n]*`)
	shiftExpr    = regexp.MustCompile(`^(\d+)\s*<<\s*(\d+)$`)
)

// headerEnum parses "typedef enum tag { ... } Name;" out of the header text,
// following C's rules for enumerators without an explicit value.
func headerEnum(t *testing.T, header, tag string) []headerConst {
	t.Helper()
	re := regexp.MustCompile(`(?s)typedef\s+enum\s+` + regexp.QuoteMeta(tag) + `\s*\{(.*?)\}\s*\w+\s*;`)
	m := re.FindStringSubmatch(header)
	require.NotNil(t, m, "enum %s not found in header", tag)
	body := lineComment.ReplaceAllString(blockComment.ReplaceAllString(m[1], ""), "")

	var out []headerConst
	next := int64(0)
	for _, item := range strings.Split(body, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, expr, explicit := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		v := next
		if explicit {
			v = evalEnumExpr(t, strings.TrimSpace(expr))
		}
		out = append(out, headerConst{name, v})
		next = v + 1
	}
	require.NotEmpty(t, out, "enum %s is empty", tag)
	return out
}

func evalEnumExpr(t *testing.T, expr string) int64 {
	t.Helper()
	if m := shiftExpr.FindStringSubmatch(expr); m != nil {
		a, _ := strconv.ParseInt(m[1], 0, 64)
		b, _ := strconv.ParseInt(m[2], 0, 64)
		return a << b
	}
	v, err := strconv.ParseInt(expr, 0, 64)
	require.NoError(t, err, "enumerator value %q", expr)
	return v
}

func TestResultTableMatchesHeader(t *testing.T) {
	consts := headerEnum(t, readHeader(t), "cudaError_enum")

	inHeader := make(map[Result]string, len(consts))
	for _, c := range consts {
		r := Result(c.value)
		assert.Equal(t, c.name, r.Name(), "name of CUresult %d", c.value)
		inHeader[r] = c.name
	}
	// Nothing in the table is absent from the header either.
	for _, e := range resultNames {
		assert.Equal(t, inHeader[e.code], e.name, "table entry %d", e.code)
	}
	assert.Len(t, resultNames, len(inHeader))
}

func TestResultTable(t *testing.T) {
	names := make(map[string]Result)
	for i, e := range resultNames {
		if i > 0 {
			require.Less(t, resultNames[i-1].code, e.code, "table must be sorted by code, without duplicates")
		}
		require.NotEmpty(t, e.name)
		if prev, dup := names[e.name]; dup {
			t.Errorf("name %s used by both %d and %d", e.name, prev, e.code)
		}
		names[e.name] = e.code
		assert.True(t, e.name == "CUDA_SUCCESS" || strings.HasPrefix(e.name, "CUDA_ERROR_"), e.name)
		assert.Equal(t, e.name, e.code.Name())
	}

	// Every named constant against the value and name the driver uses.
	for _, tc := range []struct {
		r    Result
		code int32
		name string
	}{
		{Success, 0, "CUDA_SUCCESS"},
		{ErrorInvalidValue, 1, "CUDA_ERROR_INVALID_VALUE"},
		{ErrorOutOfMemory, 2, "CUDA_ERROR_OUT_OF_MEMORY"},
		{ErrorNotInitialized, 3, "CUDA_ERROR_NOT_INITIALIZED"},
		{ErrorDeinitialized, 4, "CUDA_ERROR_DEINITIALIZED"},
		{ErrorNoDevice, 100, "CUDA_ERROR_NO_DEVICE"},
		{ErrorInvalidDevice, 101, "CUDA_ERROR_INVALID_DEVICE"},
		{ErrorInvalidContext, 201, "CUDA_ERROR_INVALID_CONTEXT"},
		{ErrorInvalidHandle, 400, "CUDA_ERROR_INVALID_HANDLE"},
		{ErrorIllegalState, 401, "CUDA_ERROR_ILLEGAL_STATE"},
		{ErrorNotFound, 500, "CUDA_ERROR_NOT_FOUND"},
		{ErrorNotReady, 600, "CUDA_ERROR_NOT_READY"},
		{ErrorIllegalAddress, 700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{ErrorPeerAccessAlreadyEnabled, 704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
		{ErrorPeerAccessNotEnabled, 705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"},
		{ErrorContextIsDestroyed, 709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
		{ErrorLaunchFailed, 719, "CUDA_ERROR_LAUNCH_FAILED"},
		{ErrorNotPermitted, 800, "CUDA_ERROR_NOT_PERMITTED"},
		{ErrorNotSupported, 801, "CUDA_ERROR_NOT_SUPPORTED"},
		{ErrorStreamCaptureUnsupported, 900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
		{ErrorStreamCaptureInvalidated, 901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
		{ErrorStreamCaptureImplicit, 906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"},
		{ErrorUnknown, 999, "CUDA_ERROR_UNKNOWN"},
		// Codes without a Go constant keep their names.
		{Result(805), 805, "CUDA_ERROR_MPS_CONNECTION_FAILED"},
		{Result(221), 221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"},
		{Result(220), 220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"},
	} {
		assert.Equal(t, tc.code, int32(tc.r), tc.name)
		assert.Equal(t, tc.name, tc.r.Name())
		assert.Equal(t, tc.name, tc.r.Error())
	}
}

func TestResultError(t *testing.T) {
	assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ErrorOutOfMemory.Error())
	assert.Equal(t, "CUDA_SUCCESS", Success.Error())
	assert.Equal(t, "CUresult(12345)", Result(12345).Error())
	assert.Equal(t, "CUresult(-1)", Result(-1).Error())
	assert.Empty(t, Result(12345).Name())
	assert.Empty(t, Result(-1).Name())

	var err error = ErrorInvalidValue
	assert.Equal(t, "CUDA_ERROR_INVALID_VALUE", fmt.Sprint(err))
	assert.Equal(t, "CUDA_ERROR_INVALID_VALUE", fmt.Sprintf("%v", err))
}

func TestResultErrorsIs(t *testing.T) {
	wrapped := fmt.Errorf("allocating: %w", ErrorOutOfMemory)
	assert.ErrorIs(t, wrapped, ErrorOutOfMemory)
	assert.NotErrorIs(t, wrapped, ErrorInvalidValue)

	op := &OpError{Op: "cuMemAlloc", Err: ErrorOutOfMemory}
	assert.ErrorIs(t, op, ErrorOutOfMemory)
	assert.ErrorIs(t, fmt.Errorf("buffer: %w", op), ErrorOutOfMemory)
	assert.Equal(t, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY", op.Error())

	var r Result
	require.ErrorAs(t, fmt.Errorf("x: %w", op), &r)
	assert.Equal(t, ErrorOutOfMemory, r)

	// Driver NOT_SUPPORTED also matches the package sentinel; nothing else does.
	assert.ErrorIs(t, ErrorNotSupported, ErrNotSupported)
	assert.ErrorIs(t, &OpError{Op: "cuMemPoolCreate", Err: ErrorNotSupported}, ErrNotSupported)
	assert.ErrorIs(t, fmt.Errorf("pool: %w", &OpError{Op: "cuMemPoolCreate", Err: ErrorNotSupported}), ErrNotSupported)
	assert.NotErrorIs(t, ErrorOutOfMemory, ErrNotSupported)
	assert.NotErrorIs(t, Result(36), ErrNotSupported) // CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER
	assert.NotErrorIs(t, ErrorNotSupported, ErrInvalidArgument)
	assert.NotErrorIs(t, ErrorNotSupported, ErrorInvalidValue)
}

func TestOpErrorResult(t *testing.T) {
	var err error = &OpError{Op: "cuX", Err: ErrorInvalidValue}
	assert.Equal(t, "cuX: CUDA_ERROR_INVALID_VALUE", err.Error())
	assert.ErrorIs(t, err, ErrorInvalidValue)
	var op *OpError
	require.ErrorAs(t, err, &op)
	assert.Equal(t, "cuX", op.Op)

	assert.Equal(t, "cuY: CUresult(4242)", (&OpError{Op: "cuY", Err: Result(4242)}).Error())
}

func TestErrorf(t *testing.T) {
	err := Errorf("Pool.Alloc", ErrInvalidArgument, "size %d is not a multiple of %d", 100, 64)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.NotErrorIs(t, err, ErrNotSupported)
	assert.Contains(t, err.Error(), "Pool.Alloc")
	assert.Contains(t, err.Error(), "100")
	assert.Contains(t, err.Error(), "64")
	assert.Equal(t, "Pool.Alloc: cuda: invalid argument: size 100 is not a multiple of 64", err.Error())
}
