// Package probe holds hostile-input tests run against the fake driver
// (internal/fakecuda, built with the system C compiler; no build tag).
//
// Tests that still fail are open bugs in code other developers are editing,
// left for them to fix:
//
//   - TestAdaptorsPartlyFreed: Limiting, Statistics and Tracking keep an
//     allocation on their books when the upstream's Deallocate fails with
//     an error wrapping buffer.ErrPartlyFreed (memory gone, Buffer closed).
//   - TestVirtualGrowShrinkHostile: virtual.Resource.Deallocate with the
//     wrong size frees the allocation under a still-open Buffer.
//   - TestVirtualOptionsHostile: virtual.New with a zero *cuda.Device in
//     Options.Peers returns an error that does not name virtual.New.
//   - TestHandleHostile: ipc.NewHandle takes ownership of an fd number
//     that is not open (its Close would later close whatever file gets
//     that number).
package probe
