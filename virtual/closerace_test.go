//go:build unix

package virtual

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// fdFake is lockedFake whose POSIX-fd exports are real descriptors (of
// /dev/null), so that Export can succeed on the CPU: the plain fake hands
// out numbers no process has open, which Export refuses.
type fdFake struct{ *lockedFake }

func (f fdFake) MemExportFD(h cuda.MemHandle) (int, error) {
	if _, err := f.lockedFake.MemExportFD(h); err != nil {
		return -1, err
	}
	return syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
}

// TestMethodsRaceCloseAnswerClosed: every method that takes a buffer,
// called on many goroutines while another closes it, answers success or
// an error matching cuda.ErrClosed, never another error. Before, a Close
// between the buffer's ownership check and its address lookup (the
// address reads 0 once closed) made them answer "not a whole allocation"
// (cuda.ErrInvalidArgument). No schedule is forced: each goroutine calls
// its method until it answers cuda.ErrClosed, so calls are in flight
// wherever the Close lands, and no answer but the two may ever appear.
func TestMethodsRaceCloseAnswerClosed(t *testing.T) {
	const g = 1 << 16
	fds := testutil.FDs(t)
	f := newFake(g)
	lf := &lockedFake{f: f}
	r, err := newResource(fdFake{lf}, fakeDevice, &Options{HandleType: HandlePosixFDAndFabric, Peers: []*cuda.Device{fakePeer1}})
	require.NoError(t, err)
	methods := []struct {
		name string
		call func(b *buffer.Buffer) error
	}{
		{"Info", func(b *buffer.Buffer) error { _, err := r.Info(b); return err }},
		{"Access", func(b *buffer.Buffer) error { _, err := r.Access(b, fakeDevice); return err }},
		{"AllocationProperties", func(b *buffer.Buffer) error { _, err := r.AllocationProperties(b); return err }},
		{"SetPeerAccess", func(b *buffer.Buffer) error { return r.SetPeerAccess(b, ReadOnly, fakePeer1) }},
		{"Export", func(b *buffer.Buffer) error {
			chunks, err := r.Export(b)
			if err != nil {
				return err
			}
			return CloseChunkFDs(chunks)
		}},
		{"ExportFabric", func(b *buffer.Buffer) error { _, err := r.ExportFabric(b); return err }},
	}
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	var mu sync.Mutex
	seen := map[string]int{} // successes per method
	for i := range rounds {
		b, err := r.Allocate(uint64(1+i%3)*g, nil)
		require.NoError(t, err)
		if i%2 == 1 {
			b, err = r.Grow(b, b.Size()+g) // two chunks
			require.NoError(t, err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, 2*len(methods)+1)
		for _, m := range methods {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					// Called until the buffer is found closed, so that
					// calls are in flight whenever the Close lands.
					ok := 0
					for {
						err := m.call(b)
						if err == nil {
							ok++
							continue
						}
						if !errors.Is(err, cuda.ErrClosed) {
							errs <- fmt.Errorf("%s racing Close (after %d successes): %w", m.name, ok, err)
						}
						break
					}
					mu.Lock()
					seen[m.name] += ok
					mu.Unlock()
				}()
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			runtime.Gosched() // let some calls begin
			if err := b.Close(); err != nil {
				errs <- fmt.Errorf("Close: %w", err)
			}
		}()
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	for _, m := range methods {
		t.Logf("%s: %d successes before the Closes", m.name, seen[m.name])
	}
	require.Empty(t, r.Live())
	require.NoError(t, r.Reclaim())
	lf.mu.Lock()
	f.requireEmpty(t)
	lf.mu.Unlock()
	testutil.AssertNoNewFDs(t, fds, "every exported descriptor was closed")
}

// TestResizeRacesCloseAnswerClosed: Grow and Shrink racing a Close of
// their buffer either take effect (the new buffer is the one to close) or
// answer cuda.ErrClosed; the memory is freed once either way.
func TestResizeRacesCloseAnswerClosed(t *testing.T) {
	const g = 1 << 16
	f := newFake(g)
	lf := &lockedFake{f: f}
	r, err := newResource(lf, fakeDevice, &Options{HandleType: HandleNone})
	require.NoError(t, err)
	for i := range 200 {
		b, err := r.Allocate(4*g, nil)
		require.NoError(t, err)
		var nb *buffer.Buffer
		var opErr, closeErr error
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			if i%2 == 0 {
				nb, opErr = r.Grow(b, 6*g)
			} else {
				nb, opErr = r.Shrink(b, g)
			}
		}()
		go func() { defer wg.Done(); <-start; closeErr = b.Close() }()
		close(start)
		wg.Wait()
		require.NoError(t, closeErr, "round %d", i)
		if opErr != nil {
			require.ErrorIs(t, opErr, cuda.ErrClosed, "round %d", i)
			require.Nil(t, nb)
		} else {
			require.NoError(t, nb.Close(), "round %d", i)
		}
	}
	require.Empty(t, r.Live())
	require.NoError(t, r.Reclaim())
	lf.mu.Lock()
	f.requireEmpty(t)
	lf.mu.Unlock()
}
