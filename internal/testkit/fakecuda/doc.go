// Package fakecuda builds a fake CUDA driver library (testdata/fakecuda.c,
// embedded; kept out of the package directory so cgo builds ignore it) for CPU
// tests: it emulates, with host memory, the driver entry points cudamem's
// memory stack uses, and counts exactly what is in use so tests can assert
// that memory and handles return to their baseline. See fakecuda.c for
// what it emulates and how strict it is.
//
// It is also how cudamem is tried without a GPU: `cudamem fake-driver`
// builds it (Build) and prints the CUDAMEM_DRIVER setting that selects it,
// and cudamem info and selftest say when it is the driver loaded (Is).
//
// Tests point the loader at it with the CUDAMEM_DRIVER environment variable
// before anything loads the driver:
//
//	path, err := fakecuda.Build(dir)
//	os.Setenv("CUDAMEM_DRIVER", path)
//
// Environment read by the fake at cuInit: FAKECUDA_DEVICES (1 or 2),
// FAKECUDA_VERSION, FAKECUDA_TOTAL_MEM; and at first use FAKECUDA_FABRIC
// (see FabricMode; Driver.SetFabric changes it at run time) and
// FAKECUDA_NO_CONCURRENT_MANAGED=1 (devices without concurrent managed
// access).
package fakecuda
