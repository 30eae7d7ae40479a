package buffer_test

import (
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// Issue 6 on the GPU: real copies crosswise between two device buffers
// (and views of them, fills, and copies made inside Use) from several
// goroutines while both buffers are closed. The deadlock was seen after
// ~50,000 iterations on an H200; every round here must finish, and every
// call succeed or fail with ErrClosed.
func TestGPUNoDeadlockCrosswiseCopies(t *testing.T) {
	d, s, _ := gpu(t)
	mr := &deviceResource{dev: d}
	const n = 64 << 10
	rnd := rand.New(rand.NewSource(1))
	deadline := time.Now().Add(5 * time.Second)
	rounds, calls := 0, 0
	for ; rounds < 5000 && time.Now().Before(deadline); rounds++ {
		a, err := buffer.Allocate(mr, n, s)
		require.NoError(t, err)
		b, err := buffer.Allocate(mr, n, s)
		require.NoError(t, err)
		type result struct {
			calls int
			err   error
		}
		done := make(chan result, 8)
		hammer := func(x, y *buffer.Buffer, kind int) {
			k := 0
			for ; ; k++ {
				var err error
				switch kind {
				case 0:
					err = x.CopyTo(y, nil)
				case 1:
					var xv, yv *buffer.Buffer
					if xv, err = x.Slice(0, n/2); err == nil {
						if yv, err = y.Slice(n/2, n/2); err == nil {
							err = yv.CopyFrom(xv, nil)
						}
					}
				case 2:
					if err = x.Fill32(uint32(k), nil); err == nil {
						err = y.Fill8(byte(k), nil)
					}
				case 3:
					err = x.Use("test", func(cuda.DevicePtr) error { return y.CopyTo(x, nil) })
				}
				if err != nil {
					if errors.Is(err, cuda.ErrClosed) {
						err = nil
					}
					done <- result{k, err}
					return
				}
			}
		}
		for kind := range 4 {
			go hammer(a, b, kind)
			go hammer(b, a, kind)
		}
		time.Sleep(time.Duration(rnd.Intn(200)) * time.Microsecond)
		closes := make(chan error, 2)
		go func() { closes <- a.Close() }()
		go func() { closes <- b.Close() }()
		for _, r := range waitAll(t, done, 8, 30*time.Second, fmt.Sprintf("round %d", rounds)) {
			require.NoError(t, r.err)
			calls += r.calls
		}
		for _, err := range waitAll(t, closes, 2, 30*time.Second, fmt.Sprintf("round %d's Closes", rounds)) {
			require.NoError(t, err)
		}
	}
	t.Logf("%d rounds, %d calls", rounds, calls)
}

// Issue 6: one staged copy failing on a destroyed stream turned staging
// off for the rest of the process (256 MiB pageable copies fell from 48
// to 6 GB/s). The copies after it must still be staged, and right.
func TestGPUStagingSurvivesFailedCopy(t *testing.T) {
	d, s, k := gpu(t)
	defer buffer.SetStaging(true)()
	const n = 2*buffer.StageMinBytes + 77
	b := alloc(t, &deviceResource{dev: d}, n, s)
	gone, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, gone.Close())

	got := make([]byte, n)
	require.ErrorIs(t, buffer.CopyFromHost(b, cudatest.Pattern(n, 1), gone), cuda.ErrClosed)
	require.ErrorIs(t, buffer.CopyToHost(got, b, gone), cuda.ErrClosed)

	before := buffer.StagedCopies()
	src := cudatest.Pattern(n, 2)
	require.NoError(t, buffer.CopyFromHost(b, src, s))
	assert.Equal(t, before+1, buffer.StagedCopies(), "the copy after the failures went through staging")
	k.RequireCheck(t, s, b.Ptr(), n, 2)
	require.NoError(t, k.Write(s, b.Ptr(), n, 3))
	require.NoError(t, buffer.CopyToHost(got, b, s))
	assert.Equal(t, before+2, buffer.StagedCopies(), "and so did the one after it")
	requireBytes(t, cudatest.Pattern(n, 3), got)
}

// dropPinnedKeepBytes allocates pinned memory, takes its Bytes and drops
// the buffer.
//
//go:noinline
func dropPinnedKeepBytes(mr buffer.MemoryResource) []byte {
	b, err := buffer.Allocate(mr, 1<<20, nil)
	if err != nil {
		panic(err)
	}
	p, err := b.Bytes()
	if err != nil {
		panic(err)
	}
	return p
}

// Issue 6: the []byte of a pinned buffer lost without Close stays usable:
// the safety net counts the leak and keeps the memory.
func TestGPUBytesOutliveLostBuffer(t *testing.T) {
	d := cudatest.Device(t)
	mr := &pinnedResource{dev: d}
	leaks, kept := buffer.Leaks(), buffer.LeaksKept()
	p := dropPinnedKeepBytes(mr)
	expectedLeaks.Add(1)
	collectUntil(t, "the lost pinned buffer was not collected", func() bool { return buffer.Leaks() == leaks+1 })
	assert.Equal(t, kept+1, buffer.LeaksKept())
	for i := range p {
		p[i] = byte(i)
	}
	for i := range p {
		if p[i] != byte(i) {
			t.Fatalf("byte %d of the kept memory changed", i)
		}
	}
	runtime.KeepAlive(p)
}
