// Package soundness holds no code: its tests are the cross-package
// soundness sweep. They import every public package of cudamem
// (cuda, buffer, resource, resource/metrics, resource/timeline, ipc,
// virtual, loader) and call every exported method of every exported type
// on a nil pointer and on a pointer to a zero value, with zero-value
// arguments, checking that nothing panics or blocks, that every error names its operation and matches
// cuda.ErrInvalidArgument or cuda.ErrClosed, that Close may be called
// twice, and that no file descriptor is closed or leaked on the way (a zero
// ipc.Handle once closed fd 0).
//
// The tests run without a driver (CPU CI) and with one (the GPU machine),
// where a zero value must still be refused in Go before any driver call.
package soundness
