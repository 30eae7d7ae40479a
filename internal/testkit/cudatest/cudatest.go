package cudatest

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/kernels"
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
		t.Skipf("GPU test: %v", err) // the error says no driver, and what was tried
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
func Pattern(n int, seed uint32) []byte { return kernels.Pattern(n, seed) }

// Kernels are the embedded test kernels (package internal/testkit/kernels) loaded
// on a device.
type Kernels struct {
	dev                       *cuda.Device
	write, check, add, fill32 *cuda.Function
}

var (
	kernelsMu sync.Mutex
	loaded    = map[*cuda.Device]*Kernels{}
)

// LoadKernels loads the test kernels on d (once per device per process).
func LoadKernels(t testing.TB, d *cuda.Device) *Kernels {
	t.Helper()
	kernelsMu.Lock()
	defer kernelsMu.Unlock()
	if k := loaded[d]; k != nil {
		return k
	}
	m, err := d.LoadModule(kernels.PTX())
	if err != nil {
		t.Fatalf("load test kernels on %v: %v", d, err)
	}
	k := &Kernels{dev: d}
	for _, f := range []struct {
		dst  **cuda.Function
		name string
	}{
		{&k.write, kernels.PatternWrite},
		{&k.check, kernels.PatternCheck},
		{&k.add, kernels.AddU32},
		{&k.fill32, kernels.FillU32},
	} {
		if *f.dst, err = m.Function(f.name); err != nil {
			t.Fatalf("%v", err)
		}
	}
	loaded[d] = k
	return k
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
