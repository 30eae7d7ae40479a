// Package cudatest holds helpers for cudamem's GPU tests: finding a device
// (skipping without one, failing instead when CUDAMEM_REQUIRE_GPU=1), and
// small kernels that read and write memory from the device side, so tests
// prove what the device sees rather than assume it. It is internal: test
// helpers are not part of cudamem's API.
package cudatest
