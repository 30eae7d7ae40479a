package fakecuda_test

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/kernels"
)

// setup returns device 0 and a stream on it, with the process's context
// retained first so that it is not part of the counters' baseline.
func setup(t *testing.T) (*cuda.Device, *cuda.Stream) {
	t.Helper()
	d, err := cuda.GetDevice(0)
	require.NoError(t, err)
	_, err = d.Context()
	require.NoError(t, err)
	s, err := d.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return d, s
}

// hostAlloc is n bytes of pinned host memory, freed when the test ends.
func hostAlloc(t *testing.T, d *cuda.Device, n int) []byte {
	t.Helper()
	p, err := d.MemHostAlloc(uint64(n), 0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.MemFreeHost(p)) })
	b := unsafe.Slice((*byte)(p), n)
	clear(b)
	return b
}

func readBack(t *testing.T, d *cuda.Device, p cuda.DevicePtr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	require.NoError(t, d.MemcpyDtoH(unsafe.Pointer(&b[0]), p, uint64(n)))
	return b
}

// A launched graph runs the copies and fills captured into it, in the
// order they were captured, at every launch, with the data there at the
// launch (not at the capture); the capture itself moves nothing.
func TestGraphLaunchRunsCapturedCopiesAndFills(t *testing.T) {
	const n = 4096
	d, s := setup(t)
	src, out := hostAlloc(t, d, n), hostAlloc(t, d, n)
	base := fake.Snapshot()
	a, err := d.MemAlloc(n)
	require.NoError(t, err)
	b, err := d.MemAlloc(n)
	require.NoError(t, err)
	require.NoError(t, s.MemsetD8Async(a, 0x11, n))
	require.NoError(t, s.MemsetD8Async(b, 0x22, n))
	require.NoError(t, s.Sync())

	require.NoError(t, s.BeginCapture())
	require.NoError(t, s.MemcpyHtoDAsync(a, unsafe.Pointer(&src[0]), n)) // a = src
	require.NoError(t, s.MemsetD32Async(a+1024, 0xdeadbeef, 256))        // a[1024:2048] = words
	require.NoError(t, s.MemcpyAsync(b, a, n))                           // b = a
	require.NoError(t, s.MemsetD8Async(b, 0x7f, 16))                     // b[:16] = 0x7f
	require.NoError(t, s.MemsetD16Async(b+n-8, 0x0102, 4))               // b[n-8:] = halfwords
	require.NoError(t, s.MemcpyDtoHAsync(unsafe.Pointer(&out[0]), b, n)) // out = b
	g, err := s.EndCapture()
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat([]byte{0x11}, n), readBack(t, d, a, n), "the capture ran nothing")
	assert.Equal(t, bytes.Repeat([]byte{0x22}, n), readBack(t, d, b, n), "the capture ran nothing")
	assert.Equal(t, make([]byte, n), out, "the capture ran nothing")

	e, err := g.Instantiate(0)
	require.NoError(t, err)
	for round, stream := range []*cuda.Stream{s, d.DefaultStream()} {
		for i := range src {
			src[i] = byte(i*7 + round*101)
		}
		want := bytes.Clone(src)
		for i := 1024; i < 2048; i += 4 {
			binary.LittleEndian.PutUint32(want[i:], 0xdeadbeef)
		}
		wantA := bytes.Clone(want)
		copy(want, bytes.Repeat([]byte{0x7f}, 16))
		for i := n - 8; i < n; i += 2 {
			binary.LittleEndian.PutUint16(want[i:], 0x0102)
		}
		require.NoError(t, e.Launch(stream), "launch %d", round+1)
		require.NoError(t, stream.Sync())
		assert.Equal(t, wantA, readBack(t, d, a, n), "launch %d: a", round+1)
		assert.Equal(t, want, readBack(t, d, b, n), "launch %d: b", round+1)
		assert.Equal(t, want, out, "launch %d: the host copy", round+1)
	}
	require.NoError(t, e.Close())
	require.NoError(t, g.Close())
	require.NoError(t, d.MemFree(a))
	require.NoError(t, d.MemFree(b))
	assert.Empty(t, fake.Snapshot().Diff(base))
}

// A launch whose captured copy would touch memory freed since the capture
// fails, and changes nothing: not even the nodes before the bad one run.
func TestGraphLaunchChecksEveryNodeFirst(t *testing.T) {
	const n = 4096
	d, s := setup(t)
	base := fake.Snapshot()
	a, err := d.MemAlloc(n)
	require.NoError(t, err)
	b, err := d.MemAlloc(n)
	require.NoError(t, err)
	require.NoError(t, s.MemsetD8Async(a, 1, n))
	require.NoError(t, s.Sync())
	require.NoError(t, s.BeginCapture())
	require.NoError(t, s.MemsetD8Async(a, 9, n))
	require.NoError(t, s.MemcpyAsync(a, b, n))
	g, err := s.EndCapture()
	require.NoError(t, err)
	e, err := g.Instantiate(0)
	require.NoError(t, err)
	require.NoError(t, d.MemFree(b))
	assert.ErrorIs(t, e.Launch(s), cuda.ErrorInvalidValue)
	assert.Equal(t, bytes.Repeat([]byte{1}, n), readBack(t, d, a, n), "the fill before the bad copy did not run")
	require.NoError(t, e.Close())
	require.NoError(t, g.Close())
	require.NoError(t, d.MemFree(a))
	assert.Empty(t, fake.Snapshot().Diff(base))
}

// cudamem's own test kernels run on the fake, directly and in a graph;
// other kernels are refused as not supported, and text that is no PTX is
// refused.
func TestFakeKernels(t *testing.T) {
	const n = 1 << 16
	d, s := setup(t)
	m, err := d.LoadModule(kernels.PTX())
	require.NoError(t, err)
	defer func() { assert.NoError(t, m.Close()) }()
	write, err := m.Function(kernels.PatternWrite)
	require.NoError(t, err)
	check, err := m.Function(kernels.PatternCheck)
	require.NoError(t, err)
	add, err := m.Function(kernels.AddU32)
	require.NoError(t, err)
	fill, err := m.Function(kernels.FillU32)
	require.NoError(t, err)
	_, err = m.Function("no_such_kernel")
	assert.ErrorIs(t, err, cuda.ErrorNotFound)

	p, err := d.MemAlloc(n)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemFree(p)) }()
	counter, err := d.MemAlloc(4)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemFree(counter)) }()
	grid, block := cuda.Dim3{X: 4}, cuda.Dim3{X: 128}
	mismatches := func(seed uint32) uint32 {
		require.NoError(t, s.MemsetD32Async(counter, 0, 1))
		require.NoError(t, check.Launch(s, grid, block, 0, p, uint64(n), seed, counter))
		require.NoError(t, s.Sync())
		return binary.LittleEndian.Uint32(readBack(t, d, counter, 4))
	}

	require.NoError(t, write.Launch(s, grid, block, 0, p, uint64(n), uint32(5)))
	require.NoError(t, s.Sync())
	assert.Equal(t, kernels.Pattern(n, 5), readBack(t, d, p, n))
	assert.Zero(t, mismatches(5))
	assert.Equal(t, uint32(n), mismatches(6), "every byte differs from the next seed's pattern")

	require.NoError(t, fill.Launch(s, grid, block, 0, p, uint64(n/4), uint32(40)))
	require.NoError(t, add.Launch(s, grid, block, 0, p, uint64(n/4), uint32(2)))
	require.NoError(t, s.Sync())
	got := readBack(t, d, p, n)
	for i := 0; i < n; i += 4 {
		require.Equal(t, uint32(42), binary.LittleEndian.Uint32(got[i:]), "word %d", i/4)
	}

	// In a graph: a fill and an add, run by each launch.
	require.NoError(t, s.BeginCapture())
	require.NoError(t, fill.Launch(s, grid, block, 0, p, uint64(n/4), uint32(100)))
	require.NoError(t, add.Launch(s, grid, block, 0, p, uint64(n/4), uint32(1)))
	require.NoError(t, add.Launch(s, grid, block, 0, p, uint64(n/4), uint32(1)))
	g, err := s.EndCapture()
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Close()) }()
	assert.Equal(t, uint32(42), binary.LittleEndian.Uint32(readBack(t, d, p, 4)), "the capture ran nothing")
	e, err := g.Instantiate(0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, e.Close()) }()
	for range 2 {
		require.NoError(t, e.Launch(s))
		require.NoError(t, s.Sync())
		assert.Equal(t, uint32(102), binary.LittleEndian.Uint32(readBack(t, d, p+n-4, 4)))
	}

	// Out of bounds: an illegal address, nothing written.
	err = write.Launch(s, grid, block, 0, p+1, uint64(n), uint32(1))
	assert.ErrorIs(t, err, cuda.ErrorIllegalAddress)

	other, err := d.LoadModule([]byte(".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry my_kernel(\n)\n{\n\tret;\n}\n"))
	require.NoError(t, err)
	defer func() { assert.NoError(t, other.Close()) }()
	_, err = other.Function("my_kernel")
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "a kernel the fake cannot run")
	_, err = other.Function(kernels.PatternWrite)
	assert.ErrorIs(t, err, cuda.ErrorNotFound, "not in this module")
	_, err = d.LoadModule([]byte("not ptx at all"))
	assert.Error(t, err)
}
