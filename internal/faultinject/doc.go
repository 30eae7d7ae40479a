// Package faultinject makes chosen driver calls fail, for tests. Built
// with -tags cudamemfault, every call through a resolved loader.Proc on
// linux/amd64 and linux/arm64 first passes through Hit, which can fail
// the k-th call (FailCall) or every call of one entry point (FailEvery)
// with a chosen CUresult without reaching the driver, and can record the
// entry point of each call (TraceStart, TraceStop). internal/suites/faultsweep
// uses it to run every public operation with each of its driver calls
// failing in turn.
//
// Without the tag this package is empty and the loader's call path has
// no hook at all: the check is a constant false and compiles away.
package faultinject
