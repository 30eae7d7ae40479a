// Package cudatest holds helpers for cudamem's GPU tests: finding a device
// (skipping without one, failing instead when CUDAMEM_REQUIRE_GPU=1), and
// small kernels that read and write memory from the device side, so tests
// prove what the device sees rather than assume it.
package cudatest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/cuda"
)

// EnvRequireGPU makes missing drivers and devices fail tests instead of
// skipping them. The GPU test runner sets it.
const EnvRequireGPU = "CUDAMEM_REQUIRE_GPU"

// Required reports whether GPU tests must not skip for want of a GPU.
func Required() bool { return os.Getenv(EnvRequireGPU) == "1" }

// Devices returns the first n devices, skipping the test when the driver or
// n devices are missing. With CUDAMEM_REQUIRE_GPU=1 a missing driver or no
// device at all fails the test; too few devices for a multi-GPU test still
// skips.
func Devices(t testing.TB, n int) []*cuda.Device {
	t.Helper()
	ds, err := cuda.Devices()
	if err != nil {
		if Required() {
			t.Fatalf("GPU required (%s=1): %v", EnvRequireGPU, err)
		}
		t.Skipf("no usable CUDA driver: %v", err)
	}
	if len(ds) == 0 {
		if Required() {
			t.Fatalf("GPU required (%s=1): no CUDA devices", EnvRequireGPU)
		}
		t.Skip("no CUDA devices")
	}
	if len(ds) < n {
		t.Skipf("test needs %d GPUs, have %d", n, len(ds))
	}
	return ds[:n]
}

// Device returns device 0; see Devices.
func Device(t testing.TB) *cuda.Device { return Devices(t, 1)[0] }

// SkipIfNotSupported skips the test when err says a feature is missing.
func SkipIfNotSupported(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, cuda.ErrNotSupported) {
		t.Skipf("not supported here: %v", err)
	}
}

// Stream returns a new stream on d, closed when the test ends.
func Stream(t testing.TB, d *cuda.Device) *cuda.Stream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Pattern returns the bytes the pattern kernels write: byte i is
// byte(uint32(i)*31 + seed).
func Pattern(n int, seed uint32) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(uint32(i)*31 + seed)
	}
	return b
}

// Kernels are the test kernels of testdata/kernels.ptx loaded on a device.
type Kernels struct {
	dev                       *cuda.Device
	write, check, add, fill32 *cuda.Function
}

var (
	kernelsMu sync.Mutex
	kernels   = map[*cuda.Device]*Kernels{}
)

// LoadKernels loads the test kernels on d (once per device per process).
func LoadKernels(t testing.TB, d *cuda.Device) *Kernels {
	t.Helper()
	kernelsMu.Lock()
	defer kernelsMu.Unlock()
	if k := kernels[d]; k != nil {
		return k
	}
	ptx, err := os.ReadFile(KernelsPath(t))
	if err != nil {
		t.Fatalf("read test kernels: %v", err)
	}
	m, err := d.LoadModule(ptx)
	if err != nil {
		t.Fatalf("load test kernels on %v: %v", d, err)
	}
	k := &Kernels{dev: d}
	for _, f := range []struct {
		dst  **cuda.Function
		name string
	}{
		{&k.write, "cudamem_pattern_write"},
		{&k.check, "cudamem_pattern_check"},
		{&k.add, "cudamem_add_u32"},
		{&k.fill32, "cudamem_fill_u32"},
	} {
		if *f.dst, err = m.Function(f.name); err != nil {
			t.Fatalf("%v", err)
		}
	}
	kernels[d] = k
	return k
}

// KernelsPath finds testdata/kernels.ptx by walking up from the working
// directory to the module root (tests run in their package directory).
func KernelsPath(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, "testdata", "kernels.ptx")
		if _, err := os.Stat(p); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return p
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testdata/kernels.ptx not found above the working directory")
		}
		dir = parent
	}
}

var shape = [2]cuda.Dim3{{X: 264}, {X: 256}}

// Write fills n bytes at p with the pattern for seed, from the device.
func (k *Kernels) Write(s *cuda.Stream, p cuda.DevicePtr, n uint64, seed uint32) error {
	return k.write.Launch(s, shape[0], shape[1], 0, p, n, seed)
}

// Check counts, on the device, the bytes at p that differ from the pattern
// for seed, and waits for the answer.
func (k *Kernels) Check(s *cuda.Stream, p cuda.DevicePtr, n uint64, seed uint32) (mismatches uint32, err error) {
	counter, err := k.dev.MemAlloc(4)
	if err != nil {
		return 0, err
	}
	defer func() {
		if ferr := k.dev.MemFree(counter); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}()
	if err := s.MemsetD32Async(counter, 0, 1); err != nil {
		return 0, err
	}
	if err := k.check.Launch(s, shape[0], shape[1], 0, p, n, seed, counter); err != nil {
		return 0, err
	}
	var out [1]uint32
	if err := s.MemcpyDtoHAsync(ptr(&out[0]), counter, 4); err != nil {
		return 0, err
	}
	if err := s.Sync(); err != nil {
		return 0, err
	}
	return out[0], nil
}

// Add adds v to each of n 32-bit words at p, on the device.
func (k *Kernels) Add(s *cuda.Stream, p cuda.DevicePtr, words uint64, v uint32) error {
	return k.add.Launch(s, shape[0], shape[1], 0, p, words, v)
}

// Fill32 sets each of n 32-bit words at p to v, on the device.
func (k *Kernels) Fill32(s *cuda.Stream, p cuda.DevicePtr, words uint64, v uint32) error {
	return k.fill32.Launch(s, shape[0], shape[1], 0, p, words, v)
}

// RequireCheck fails the test unless the device sees the pattern at p.
func (k *Kernels) RequireCheck(t testing.TB, s *cuda.Stream, p cuda.DevicePtr, n uint64, seed uint32) {
	t.Helper()
	m, err := k.Check(s, p, n, seed)
	if err != nil {
		t.Fatalf("pattern check on %v: %v", k.dev, err)
	}
	if m != 0 {
		t.Fatalf("pattern check on %v: %d of %d bytes differ (seed %d)", k.dev, m, n, seed)
	}
}

// String names the kernel set's device.
func (k *Kernels) String() string { return fmt.Sprintf("test kernels on %v", k.dev) }
