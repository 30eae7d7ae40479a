// Package faultsweep holds cudamem's driver fault-injection sweeps: tests
// (build tag cudamemfault) that run every public memory operation with each
// of its driver calls failing in turn, and check after each that the error
// matches the injected CUresult and names the failed entry point, that
// nothing panicked or deadlocked, that the object still works (or is
// cleanly closed), and that device memory, pool usage, open file
// descriptors and buffer.Leaks are back to their baseline.
//
// On a machine without a GPU the sweeps run against the fake driver of
// internal/testkit/fakecuda (built with the system C compiler); with
// CUDAMEM_DRIVER set, or CUDAMEM_REQUIRE_GPU=1, against that driver:
//
//	go test -tags cudamemfault ./internal/suites/faultsweep
//
// Without the tag this package is empty.
package faultsweep
