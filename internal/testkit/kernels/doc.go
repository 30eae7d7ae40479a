// Package kernels holds cudamem's PTX kernels, embedded once: the tests
// (through internal/testkit/cudatest) and `cudamem selftest` use them to prove
// what the device itself reads and writes, rather than assume it.
//
// The kernels and their parameters are described in README.md beside
// kernels.ptx.
package kernels
