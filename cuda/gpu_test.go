package cuda_test

import (
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

func TestDriverLoads(t *testing.T) {
	cudatest.Device(t)
	path, version, err := cuda.Driver()
	require.NoError(t, err)
	assert.NotEmpty(t, path)
	assert.GreaterOrEqual(t, version, 12000)
	missing, err := cuda.DriverMissing()
	require.NoError(t, err)
	t.Logf("driver %s (CUDA %s), missing entry points: %v", path, cuda.VersionString(version), missing)
	assert.Empty(t, missing, "a CUDA 13 driver provides every entry point we use")
}

func TestDevicesMatchNvidiaSmi(t *testing.T) {
	cudatest.Devices(t, 1)
	all, err := cuda.Devices()
	require.NoError(t, err)
	out, err := exec.Command("nvidia-smi", "-L").Output()
	if err != nil {
		t.Skipf("nvidia-smi -L: %v", err)
	}
	// "GPU 0: NVIDIA H200 (UUID: GPU-....)"
	re := regexp.MustCompile(`(?m)^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)`)
	m := re.FindAllStringSubmatch(string(out), -1)
	require.Len(t, all, len(m), "device count matches nvidia-smi -L:\n%s", out)
	// Ordinals can differ (CUDA_DEVICE_ORDER); match by UUID.
	smi := map[string]string{}
	for _, row := range m {
		smi[row[3]] = row[2]
	}
	for _, d := range all {
		name, err := d.Name()
		require.NoError(t, err)
		u, err := d.UUID()
		require.NoError(t, err)
		assert.Equal(t, smi[u.GPUString()], name, "device %v UUID %v", d, u.GPUString())
	}
}

func TestDeviceQueries(t *testing.T) {
	d := cudatest.Device(t)
	total, err := d.TotalMemory()
	require.NoError(t, err)
	assert.Greater(t, total, uint64(1<<30))
	free, total2, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, total, total2)
	assert.LessOrEqual(t, free, total)
	major, minor, err := d.ComputeCapability()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, major, 5)
	t.Logf("%v: CC %d.%d, %d MiB", d, major, minor, total>>20)
	f, err := d.Features()
	require.NoError(t, err)
	t.Logf("features: %+v", f)
	bus, err := d.PCIBusID()
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]$`, bus)
	ok, err := d.CanAccessPeer(d)
	require.NoError(t, err)
	assert.False(t, ok, "a device is not its own peer")
}

func TestDeviceOrdinalOutOfRange(t *testing.T) {
	cudatest.Device(t)
	n, err := cuda.DeviceCount()
	require.NoError(t, err)
	_, err = cuda.GetDevice(n)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "out of range")
	d0, err := cuda.GetDevice(0)
	require.NoError(t, err)
	d0again, _ := cuda.GetDevice(0)
	assert.Same(t, d0, d0again, "devices are singletons")
}

func TestStreamAndEvent(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	const n = 64 << 20
	p, err := d.MemAlloc(n)
	require.NoError(t, err)
	defer d.MemFree(p)

	start, err := d.NewEvent(cuda.EventDefault)
	require.NoError(t, err)
	defer start.Close()
	end, err := d.NewEvent(cuda.EventDefault)
	require.NoError(t, err)
	defer end.Close()

	require.NoError(t, start.Record(s))
	require.NoError(t, k.Write(s, p, n, 7))
	require.NoError(t, end.Record(s))
	require.NoError(t, end.Sync())
	done, err := end.Done()
	require.NoError(t, err)
	assert.True(t, done)
	el, err := cuda.Elapsed(start, end)
	require.NoError(t, err)
	assert.Greater(t, el, time.Duration(0))

	// A second stream waits for the first through an event and sees its data.
	s2 := cudatest.Stream(t, d)
	require.NoError(t, k.Write(s, p, n, 9))
	require.NoError(t, s2.WaitStream(s))
	k.RequireCheck(t, s2, p, n, 9)

	require.NoError(t, s.Sync())
	done, err = s.Done()
	require.NoError(t, err)
	assert.True(t, done)

	lo, hi, err := d.StreamPriorityRange()
	require.NoError(t, err)
	hp, err := d.NewStreamWith(cuda.StreamNonBlocking, hi)
	require.NoError(t, err)
	require.NoError(t, hp.Close())
	_ = lo
}

func TestClosedStreamUsedAgain(t *testing.T) {
	d := cudatest.Device(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	assert.ErrorIs(t, s.Sync(), cuda.ErrClosed)
	assert.ErrorIs(t, s.MemsetD8Async(0, 0, 1), cuda.ErrClosed)
	e, err := d.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	assert.ErrorIs(t, e.Record(d.DefaultStream()), cuda.ErrClosed)
	// The default stream cannot be closed.
	require.NoError(t, d.DefaultStream().Close())
	require.NoError(t, d.DefaultStream().Sync())
}

func TestHostDeviceRoundTrip(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	const n = 1 << 20
	p, err := d.MemAlloc(n)
	require.NoError(t, err)
	defer d.MemFree(p)
	src := cudatest.Pattern(n, 3)
	require.NoError(t, s.MemcpyHtoDAsync(p, unsafe.Pointer(&src[0]), n))
	k.RequireCheck(t, s, p, n, 3)
	require.NoError(t, k.Add(s, p, n/4, 1))
	got := make([]byte, n)
	require.NoError(t, s.MemcpyDtoHAsync(unsafe.Pointer(&got[0]), p, n))
	require.NoError(t, s.Sync())
	for i := 0; i < n; i += 4 {
		w := uint32(src[i]) | uint32(src[i+1])<<8 | uint32(src[i+2])<<16 | uint32(src[i+3])<<24
		w++
		g := uint32(got[i]) | uint32(got[i+1])<<8 | uint32(got[i+2])<<16 | uint32(got[i+3])<<24
		if g != w {
			t.Fatalf("word %d: got %#x, want %#x", i/4, g, w)
		}
	}
	// Fills.
	require.NoError(t, s.MemsetD32Async(p, 0xdeadbeef, n/4))
	require.NoError(t, s.MemcpyDtoHAsync(unsafe.Pointer(&got[0]), p, 8))
	require.NoError(t, s.Sync())
	assert.Equal(t, []byte{0xef, 0xbe, 0xad, 0xde, 0xef, 0xbe, 0xad, 0xde}, got[:8])
}

func TestOutOfMemory(t *testing.T) {
	d := cudatest.Device(t)
	total, err := d.TotalMemory()
	require.NoError(t, err)
	_, err = d.MemAlloc(total * 4)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "cuMemAlloc")
	assert.Contains(t, err.Error(), "requested")
	// The device still works.
	p, err := d.MemAlloc(1 << 20)
	require.NoError(t, err)
	require.NoError(t, d.MemFree(p))
}

func TestPoolPrimitives(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	pool, err := d.CreateMemPool(&cuda.MemPoolProps{
		AllocType: cuda.MemAllocationTypePinned,
		Location:  cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())},
	})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	defer func() { require.NoError(t, pool.Destroy()) }()
	require.NoError(t, pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, ^uint64(0)))
	v, err := pool.Attribute(cuda.MemPoolAttrReleaseThreshold)
	require.NoError(t, err)
	assert.Equal(t, ^uint64(0), v, "64-bit attribute round-trips whole")
	err = pool.SetAttribute(cuda.MemPoolAttrReuseAllowOpportunistic, 2)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.NoError(t, pool.SetAttribute(cuda.MemPoolAttrReuseAllowOpportunistic, 0))
	v, err = pool.Attribute(cuda.MemPoolAttrReuseAllowOpportunistic)
	require.NoError(t, err)
	assert.Equal(t, uint64(0), v)

	const n = 3 << 20
	p, err := s.MemAllocFromPoolAsync(pool, n)
	require.NoError(t, err)
	used, err := pool.Attribute(cuda.MemPoolAttrUsedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, used, uint64(n))
	require.NoError(t, k.Write(s, p, n, 5))
	k.RequireCheck(t, s, p, n, 5)
	info, err := cuda.QueryPointer(p)
	require.NoError(t, err)
	assert.Equal(t, cuda.MemoryTypeDevice, info.Type)
	assert.Equal(t, d.Ordinal(), info.Device)
	assert.Equal(t, pool.Handle(), info.Pool)
	require.NoError(t, s.MemFreeAsync(p))
	require.NoError(t, s.Sync())
	used, err = pool.Attribute(cuda.MemPoolAttrUsedMemCurrent)
	require.NoError(t, err)
	assert.Zero(t, used)
	require.NoError(t, pool.TrimTo(0))
	reserved, err := pool.Attribute(cuda.MemPoolAttrReservedMemCurrent)
	require.NoError(t, err)
	assert.Zero(t, reserved, "trim to 0 releases everything unused")
}

// TestContextStress runs driver calls from many goroutines on every GPU
// with GOMAXPROCS >= 4. Goroutines hop between OS threads; every call must
// still run in its device's context.
func TestContextStress(t *testing.T) {
	cudatest.Devices(t, 1)
	devs, err := cuda.Devices()
	require.NoError(t, err)
	if runtime.GOMAXPROCS(0) < 4 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	}
	streams := make([]*cuda.Stream, len(devs))
	kernels := make([]*cudatest.Kernels, len(devs))
	for i, d := range devs {
		streams[i] = cudatest.Stream(t, d)
		kernels[i] = cudatest.LoadKernels(t, d)
	}
	const goroutines, iters, n = 256, 20, 64 << 10
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			d := devs[g%len(devs)]
			k := kernels[g%len(devs)]
			s, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			for i := 0; i < iters; i++ {
				seed := uint32(g*iters + i)
				p, err := s.MemAllocAsync(n)
				if err == nil {
					err = k.Write(s, p, n, seed)
				}
				var got [16]byte
				if err == nil {
					err = s.MemcpyDtoHAsync(unsafe.Pointer(&got[0]), p, 16)
				}
				if err == nil {
					err = s.MemFreeAsync(p)
				}
				if err == nil {
					err = s.Sync()
				}
				if err == nil {
					want := cudatest.Pattern(16, seed)
					if string(got[:]) != string(want) {
						err = errors.New("data mismatch on " + d.String())
					}
				}
				if err != nil {
					errs <- err
					return
				}
				runtime.Gosched()
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NotErrorIs(t, err, cuda.ErrorInvalidContext)
		assert.NoError(t, err)
	}
}

func TestLoadModuleErrors(t *testing.T) {
	d := cudatest.Device(t)
	_, err := d.LoadModule(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = d.LoadModule([]byte("not ptx at all"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuModuleLoadData")
}

// Benchmarks: the driver call path. The cgo baseline of the same calls is
// testdata/cgobench (cudamem bench runs both and prints ratios).
func BenchmarkDriverGetVersion(b *testing.B) {
	cudatest.Device(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cuda.DriverVersion(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPoolPair(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	pool, err := d.DefaultMemPool()
	require.NoError(b, err)
	require.NoError(b, pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, ^uint64(0)))
	for _, size := range []uint64{256, 1 << 20, 64 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := s.MemAllocFromPoolAsync(pool, size)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.MemFreeAsync(p); err != nil {
					b.Fatal(err)
				}
			}
			require.NoError(b, s.Sync())
		})
	}
}

func sizeName(n uint64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
