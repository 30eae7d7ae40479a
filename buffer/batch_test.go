package buffer_test

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// These need no driver: every batch here fails in Go before any driver
// call (fake addresses never reach a driver), the valid ones when the nil
// stream is resolved for the fake resource's device, which no machine
// has.

// batchIndex returns the copy a CopyBatch error names, or -1.
func batchIndex(err error) int {
	var be *cuda.BatchCopyError
	if errors.As(err, &be) {
		return be.Index
	}
	return -1
}

func TestFakeCopyBatchEmpty(t *testing.T) {
	assert.NoError(t, buffer.CopyBatch(nil, nil))
	assert.NoError(t, buffer.CopyBatch(nil, []buffer.Copy{}))
	err := buffer.CopyBatch(new(cuda.Stream), nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a zero stream is refused even with no copies")
	assert.Contains(t, err.Error(), "CopyBatch")
}

func TestFakeCopyBatchChecks(t *testing.T) {
	mr := newFake()
	a, b := mr.alloc(4096), mr.alloc(4096)
	defer closeBatchBufs(t, a, b)
	closed := mr.alloc(64)
	require.NoError(t, closed.Close())
	view, err := a.Slice(1024, 1024)
	require.NoError(t, err)
	good := buffer.Copy{Dst: a, Src: b, Size: 16}

	for _, tc := range []struct {
		name  string
		bad   buffer.Copy
		is    error
		words []string
	}{
		{"nil dst", buffer.Copy{Src: b, Size: 1}, cuda.ErrInvalidArgument, []string{"nil buffer"}},
		{"nil src", buffer.Copy{Dst: a, Size: 1}, cuda.ErrInvalidArgument, []string{"nil buffer"}},
		{"zero dst", buffer.Copy{Dst: new(buffer.Buffer), Src: b, Size: 1}, cuda.ErrInvalidArgument, []string{"zero Buffer"}},
		{"closed src", buffer.Copy{Dst: a, Src: closed, Size: 1}, cuda.ErrClosed, []string{"the source"}},
		{"closed dst", buffer.Copy{Dst: closed, Src: a, Size: 1}, cuda.ErrClosed, []string{"the destination"}},
		{"bad range", buffer.Copy{Dst: buffer.FromPointer(0, 16), Src: a, Size: 1}, cuda.ErrInvalidArgument, []string{"address 0"}},
		{"dst past end", buffer.Copy{Dst: a, Src: b, DstOffset: 4000, Size: 97}, cuda.ErrInvalidArgument, []string{"destination range [4000, 4000+97)", "4096-byte"}},
		{"src past end", buffer.Copy{Dst: a, Src: b, SrcOffset: 1, Size: 4096}, cuda.ErrInvalidArgument, []string{"source range [1, 1+4096)"}},
		{"offset past end", buffer.Copy{Dst: a, Src: b, DstOffset: 4097}, cuda.ErrInvalidArgument, []string{"destination range"}},
		{"offset overflow", buffer.Copy{Dst: a, Src: b, SrcOffset: math.MaxUint64, Size: 2}, cuda.ErrInvalidArgument, []string{"source range"}},
		{"size overflow", buffer.Copy{Dst: a, Src: b, DstOffset: 8, Size: math.MaxUint64 - 4}, cuda.ErrInvalidArgument, []string{"destination range"}},
		{"view past end", buffer.Copy{Dst: view, Src: b, DstOffset: 1000, Size: 25}, cuda.ErrInvalidArgument, []string{"1024-byte"}},
		{"overlap", buffer.Copy{Dst: a, Src: a, DstOffset: 8, Size: 16}, cuda.ErrInvalidArgument, []string{"overlap", "offsets 0 and 8"}},
		{"overlap through a view", buffer.Copy{Dst: view, Src: a, SrcOffset: 1030, Size: 16}, cuda.ErrInvalidArgument, []string{"overlap", "offsets 1030 and 1024"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			copies := []buffer.Copy{good, good, tc.bad, good}
			err := buffer.CopyBatch(nil, copies)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.is)
			assert.Equal(t, 2, batchIndex(err), "the error names the bad copy: %v", err)
			assert.Contains(t, err.Error(), "CopyBatch")
			assert.Contains(t, err.Error(), "copy 2 of 4")
			for _, w := range tc.words {
				assert.Contains(t, err.Error(), w)
			}
			var oe *cuda.OpError
			assert.ErrorAs(t, err, &oe)
		})
	}
	// Nothing reached the resource, and every buffer is usable: the holds
	// taken before the bad copy were let go (Close would wait otherwise).
	assert.Empty(t, mr.freed[1:], "only the closed buffer was freed")
	assert.False(t, a.IsClosed())
}

func TestFakeCopyBatchValidCopiesReachStreamResolution(t *testing.T) {
	mr := newFake()
	a, b := mr.alloc(4096), mr.alloc(4096)
	defer closeBatchBufs(t, a, b)
	// Non-overlapping copies within one buffer, a copy of 0 bytes and one
	// ending exactly at the end: all valid, so the batch goes on to resolve
	// the nil stream, which fails for the fake's device (no driver call).
	err := buffer.CopyBatch(nil, []buffer.Copy{
		{Dst: a, Src: a, DstOffset: 0, SrcOffset: 16, Size: 16},
		{Dst: a, Src: b, DstOffset: 4096, SrcOffset: 4096},
		{Dst: b, Src: a, DstOffset: 4000, SrcOffset: 96, Size: 96},
		{Dst: a, Src: a, Size: 0},
	})
	require.Error(t, err)
	assert.Equal(t, -1, batchIndex(err), "a stream failure names no copy: %v", err)
	assert.False(t, errors.Is(err, cuda.ErrClosed))
}

// Batches that share buffers, duplicates included, never deadlock with
// each other or with Close: holds never wait, and a Close under way makes
// a batch fail with ErrClosed.
func TestFakeCopyBatchConcurrentClose(t *testing.T) {
	mr := newFake()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			a, b := mr.alloc(256), mr.alloc(256)
			copies := []buffer.Copy{
				{Dst: a, Src: b, Size: 8}, {Dst: b, Src: a, Size: 8, DstOffset: 64, SrcOffset: 64},
				{Dst: a, Src: a, Size: 8, DstOffset: 128}, {Dst: b, Src: b, Size: 8, SrcOffset: 200},
			}
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rev := make([]buffer.Copy, len(copies))
					for i := range copies {
						rev[i] = copies[(i+g)%len(copies)]
					}
					for range 20 {
						err := buffer.CopyBatch(nil, rev)
						if err != nil && errors.Is(err, cuda.ErrClosed) {
							if idx := batchIndex(err); idx < 0 || idx >= len(rev) {
								t.Errorf("closed error names copy %d: %v", idx, err)
							}
							return
						}
					}
				}()
			}
			wg.Add(2)
			go func() { defer wg.Done(); assert.NoError(t, a.Close()) }()
			go func() { defer wg.Done(); assert.NoError(t, b.Close()) }()
			wg.Wait()
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("deadlock: CopyBatch and Close did not finish in 30 s")
	}
	assert.Empty(t, mr.live, "every buffer was freed")
}

func closeBatchBufs(t *testing.T, bs ...*buffer.Buffer) {
	t.Helper()
	for _, b := range bs {
		assert.NoError(t, b.Close())
	}
}
