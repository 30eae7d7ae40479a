// Package warn reports the failures of cudamem's background releases: the
// garbage-collection safety nets (a leaked Buffer's free, a leaked graph's
// destruction, a leaked file descriptor's close) and deferred destructions
// (a pool destroyed by its last free, or once a capture ends). They run
// where no caller waits for an error, so one that fails is logged instead,
// as cuda.core raises its CUDAWarning: a log/slog record at Warn level, on
// slog.Default() as it is at each call (so a later slog.SetDefault takes
// effect, as resource.Logging does with a nil logger).
//
//	level=WARN msg="cudamem: background release failed" op="Buffer safety net: Deallocate" addr=0x7f3a40000000 size=1048576 err="..."
//
// The message is always Msg, so a handler can pick these records out.
package warn
