// Package probe holds hostile-input tests run against the fake driver
// (internal/testkit/fakecuda, built with the system C compiler; no build tag):
// every public API called as a hostile user would, with sizes at the
// edges, overflowing offsets, closed and zero handles as arguments,
// foreign and double frees, garbage from sockets, and concurrent Close.
// Each test that found a bug stays as its regression test (adaptors and
// buffer.ErrPartlyFreed, virtual frees of the wrong size, virtual.New's
// peer errors, ipc.NewHandle on descriptors that are not open, imports
// on zero or closed streams, raw copies whose ranges wrap past 2^64).
// Linux only: it reads /proc/self/fd.
package probe
