// Package osfd is the one owned file-descriptor type of cudamem: package
// ipc keeps exported pools, received descriptors and duplicates in it, and
// package virtual its exported chunks, instead of bare ints that are easy to
// close twice or never.
//
// A File closes its descriptor exactly once (Close is idempotent), keeps it
// close-on-exec (New sets the flag on a descriptor it takes, and duplicates
// are made with it), so that it never leaks into a child that was not
// handed it on purpose (OSFile, for exec.Cmd.ExtraFiles), holds it open
// while a caller uses it (Use), and
// carries a garbage-collector safety net: a File lost without Close has its
// descriptor closed by a cleanup, counted by Leaks so tests can assert zero.
//
// The zero File and a nil *File own nothing: Close on them does nothing and
// never closes descriptor 0, and every other method reports an error
// matching cuda.ErrInvalidArgument. On systems without POSIX descriptors
// (Windows) New reports cuda.ErrNotSupported.
package osfd
