package virtual_test

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

func requireAsleepErr(t *testing.T, err error, tag string) {
	t.Helper()
	var ae *virtual.AsleepError
	require.ErrorIs(t, err, virtual.ErrAsleep)
	require.ErrorAs(t, err, &ae)
	require.Equal(t, tag, ae.Tag, "the error names the tag")
}

// TestGPUSleepWake puts two tags of three to sleep in each backup mode:
// the device's free memory grows by at least 99% of the bytes slept, a
// second workload uses them, every use of the sleeping buffers through
// cudamem is refused naming the tag while the third tag works on, and
// after Wake the buffers are at the same addresses with every byte back.
func TestGPUSleepWake(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r, err := virtual.New(d, &virtual.Options{Tag: "weights"})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	gran := r.Granularity()
	w, err := r.Allocate(128<<20, s)
	require.NoError(t, err)
	kv, err := r.AllocateTagged("kv", 64<<20+123, s)
	require.NoError(t, err)
	scratch, err := r.AllocateTagged("scratch", 1<<20, s)
	require.NoError(t, err)
	defer func() {
		for _, b := range []*buffer.Buffer{w, kv, scratch} {
			assert.NoError(t, b.Close())
		}
		assert.NoError(t, r.DropHostBackup())
	}()
	bufs := []*buffer.Buffer{w, kv, scratch}
	for i, b := range bufs {
		require.NoError(t, k.Write(s, b.Ptr(), b.Size(), uint32(i+1)))
	}
	require.NoError(t, s.Sync())
	slept := uint64(128<<20) + (64<<20+123+gran-1)/gran*gran
	for _, mode := range []virtual.Backup{virtual.BackupToHost, virtual.BackupToWriter, virtual.Discard} {
		t.Run(mode.String(), func(t *testing.T) {
			so := &virtual.SleepOptions{Backup: mode}
			var file *os.File
			if mode == virtual.BackupToWriter {
				file, err = os.Create(filepath.Join(t.TempDir(), "backup"))
				require.NoError(t, err)
				defer file.Close()
				so.Writer = file
			}
			ptrs := []cuda.DevicePtr{w.Ptr(), kv.Ptr()}
			free0, _, err := d.MemInfo()
			require.NoError(t, err)
			require.NoError(t, r.Sleep(so, "weights", "kv"))
			free1, _, err := d.MemInfo()
			require.NoError(t, err)
			assert.GreaterOrEqual(t, float64(free1)-float64(free0), 0.99*float64(slept), "free memory after sleep: %d more, %d slept", int64(free1-free0), slept)

			// Refused, naming the tag: a Buffer call, a kernel launch.
			requireAsleepErr(t, w.Fill8(0, s), "weights")
			_, err = kv.ReadAt(make([]byte, 16), 0)
			requireAsleepErr(t, err, "kv")
			requireAsleepErr(t, k.Write(s, kv.Ptr(), 16, 9), "kv")
			// The third tag works on.
			k.RequireCheck(t, s, scratch.Ptr(), scratch.Size(), 3)

			// A second workload takes the memory freed.
			other, err := virtual.New(d, nil)
			require.NoError(t, err)
			big, err := other.Allocate(slept, s)
			require.NoError(t, err, "allocating the %d bytes sleep freed", slept)
			require.NoError(t, k.Write(s, big.Ptr(), big.Size(), 77))
			k.RequireCheck(t, s, big.Ptr(), big.Size(), 77)
			require.NoError(t, big.Close())

			wo := &virtual.WakeOptions{KeepHostBackup: true}
			if file != nil {
				_, err := file.Seek(0, 0)
				require.NoError(t, err)
				wo.Reader = file
			}
			require.NoError(t, r.Wake(wo, "weights", "kv"))
			assert.Equal(t, ptrs, []cuda.DevicePtr{w.Ptr(), kv.Ptr()})
			if mode == virtual.Discard {
				// Contents are undefined: write them again for the next mode.
				require.NoError(t, k.Write(s, w.Ptr(), w.Size(), 1))
				require.NoError(t, k.Write(s, kv.Ptr(), kv.Size(), 2))
			}
			for i, b := range bufs {
				k.RequireCheck(t, s, b.Ptr(), b.Size(), uint32(i+1))
			}
			st := r.SleepStats()
			require.Len(t, st, 2)
			for _, x := range st {
				assert.Zero(t, x.Asleep, "tag %q", x.Tag)
				assert.NotZero(t, x.LastSleep, "tag %q", x.Tag)
				assert.NotZero(t, x.LastWake, "tag %q", x.Tag)
			}
		})
	}
}

// TestGPUSleepGraph captures a kernel over memory, launches the graph,
// puts the memory to sleep and wakes it, and launches the same graph
// again: it runs over the memory at the same address with its contents
// restored.
func TestGPUSleepGraph(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	r, err := virtual.New(d, &virtual.Options{Tag: "graph"})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	const words = 1 << 20
	b, err := r.Allocate(words*4, s)
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	require.NoError(t, b.Fill32(100, s))
	require.NoError(t, s.BeginCapture())
	require.NoError(t, k.Add(s, b.Ptr(), words, 1))
	g, err := s.EndCapture()
	require.NoError(t, err)
	e, err := g.Instantiate(0)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	defer func() { assert.NoError(t, e.Close()) }()
	launch := func(n int) {
		for range n {
			require.NoError(t, e.Launch(s))
		}
		require.NoError(t, s.Sync())
	}
	want := func(v uint32) {
		out := make([]uint32, words)
		_, err := b.ReadAt(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), words*4), 0)
		require.NoError(t, err)
		for i, x := range out {
			if x != v {
				t.Fatalf("word %d is %d, want %d", i, x, v)
			}
		}
	}
	launch(3)
	want(103)
	require.NoError(t, r.Sleep(&virtual.SleepOptions{Backup: virtual.BackupToHost}, "graph"))
	require.NoError(t, r.Wake(nil, "graph"))
	launch(2)
	want(105)
}

// TestGPUPoolSleep puts a pool to sleep through its Resource: each block
// goes through the segment hooks once each way, an allocation the pool
// would carve out of a sleeping block is refused, and after Wake every
// allocation holds its data.
func TestGPUPoolSleep(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	var acquired, released int
	hooks := &resource.SegmentHooks{
		Acquired: func(cuda.DevicePtr, uint64) error { acquired++; return nil },
		Released: func(cuda.DevicePtr, uint64) error { released++; return nil },
	}
	p, gran := newPool(t, d, &virtual.PoolOptions{Memory: &virtual.Options{Tag: "kv"}, Segments: hooks})
	r := p.Upstream().(*virtual.Resource)
	var bufs []*buffer.Buffer
	for i, n := range []uint64{gran / 2, 3 * gran, 1000, gran + 7} {
		b, err := p.Allocate(n, s)
		require.NoError(t, err)
		require.NoError(t, k.Write(s, b.Ptr(), n, uint32(i+1)))
		bufs = append(bufs, b)
	}
	require.NoError(t, s.Sync())
	blocks := acquired
	require.NoError(t, r.Sleep(&virtual.SleepOptions{Backup: virtual.BackupToHost}, "kv"))
	assert.Equal(t, blocks, released, "each block released once by Sleep")
	_, err := p.Allocate(512, s)
	requireAsleepErr(t, err, "kv")
	require.NoError(t, r.Wake(nil, "kv"))
	assert.Equal(t, 2*blocks, acquired, "each block acquired again by Wake")
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), b.Size(), uint32(i+1))
		require.NoError(t, b.Close())
	}
	require.NoError(t, p.Close())
	assert.Equal(t, acquired, released, "hooks balanced")
}

// TestGPUSleepPoolAsleepClose closes a pool's buffers and the pool while
// it sleeps: the blocks are given back without being released twice and
// nothing stays mapped.
func TestGPUSleepPoolAsleepClose(t *testing.T) {
	d := cudatest.Device(t)
	s := cudatest.Stream(t, d)
	var acquired, released int
	hooks := &resource.SegmentHooks{
		Acquired: func(cuda.DevicePtr, uint64) error { acquired++; return nil },
		Released: func(cuda.DevicePtr, uint64) error { released++; return nil },
	}
	p, gran := newPool(t, d, &virtual.PoolOptions{Segments: hooks})
	r := p.Upstream().(*virtual.Resource)
	b, err := p.Allocate(2*gran, s)
	require.NoError(t, err)
	require.NoError(t, r.Sleep(nil))
	require.NoError(t, b.Close())
	require.NoError(t, p.Close())
	assert.Equal(t, acquired, released, "hooks balanced")
	assert.Empty(t, r.Live())
	require.NoError(t, r.Wake(nil), "nothing left to wake")
}

// TestSleepFake runs the sleep GPU tests over the fake driver, so that
// they run on machines without a GPU.
func TestSleepFake(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestGPUSleepWake", "TestGPUSleepGraph", "TestGPUPoolSleep", "TestGPUSleepPoolAsleepClose")
}
