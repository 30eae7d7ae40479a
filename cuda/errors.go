package cuda

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/loader"
)

// Sentinel errors. Match them with errors.Is; every error this module returns
// wraps one of these or a Result.
var (
	// ErrNoDriver means the CUDA driver library could not be loaded. The
	// wrapped loader error lists every path tried and why each failed.
	ErrNoDriver = errors.New("cuda: no CUDA driver")

	// ErrNotSupported means the driver, the device or this platform lacks the
	// feature: an entry point the installed driver does not export, a device
	// attribute that says no, or CUDA_ERROR_NOT_SUPPORTED from the driver.
	ErrNotSupported = errors.New("cuda: not supported")

	// ErrClosed means a handle was used after Close. It is the same value
	// as loader.ErrClosed, so the loader's errors match it too.
	ErrClosed = loader.ErrClosed

	// ErrInvalidArgument means Go-side validation rejected an argument before
	// any driver call was made (nil or zero handles, zero or impossible
	// sizes). It is the same value as loader.ErrInvalidArgument.
	ErrInvalidArgument = loader.ErrInvalidArgument
)

// OpError records the operation that failed (a driver entry point such as
// "cuMemPoolCreate", or a method such as "Stream.Sync") and why.
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string {
	switch {
	case e == nil:
		return "<nil>"
	case e.Err == nil:
		return e.Op + ": <nil>"
	}
	return e.Op + ": " + e.Err.Error()
}

// Unwrap returns the underlying error (a Result or a sentinel).
func (e *OpError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// Errorf returns an error naming op that wraps base (for example
// ErrInvalidArgument) with a formatted explanation that should include the
// offending values. Higher layers use it so their errors read like this
// package's.
func Errorf(op string, base error, format string, args ...any) error {
	return &OpError{Op: op, Err: fmt.Errorf("%w: "+format, append([]any{base}, args...)...)}
}

// zeroHandleErr is the error for op, whose driver call (entry point
// name) reported success but returned handle 0 (what names the handle's
// kind): a broken driver's answer, reported rather than handed out as a
// handle every later call would refuse or the driver would take as NULL.
func zeroHandleErr(op, name, what string) error {
	return &OpError{Op: op, Err: fmt.Errorf("%w: %s reported success but returned %s 0", ErrorUnknown, name, what)}
}
