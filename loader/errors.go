package loader

import "errors"

// Sentinel errors shared with package cuda, which re-exports them as
// cuda.ErrInvalidArgument and cuda.ErrClosed: they live here, the lowest
// layer, so the loader's own errors match them without importing cuda.
var (
	// ErrInvalidArgument means a nil or zero value (a Library not from
	// OpenLibrary, say) or a bad argument was refused before any call into
	// the library.
	ErrInvalidArgument = errors.New("cuda: invalid argument")

	// ErrClosed means a handle was used after Close.
	ErrClosed = errors.New("cuda: use of closed handle")
)
