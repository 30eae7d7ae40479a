package virtual

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// TestReadersRaceClose: every method that reads or exports an allocation
// found by take (Export, ExportFabric, Info, AllocationProperties, Access,
// SetPeerAccess) must check, under r.mu and with the buffer held open,
// that the allocation is still filed: a Close in between (Deallocate
// files it out under r.mu, then frees it outside) made Export hand
// released handles to the driver and Info read freed state (a data race
// under -race) and report success.
//
// The schedule: the test holds r.mu long enough that the mutex turns to
// handing itself over in order (a waiter that waited over 1 ms puts it in
// starvation mode): the method's take (which finds the allocation), then
// Close's Deallocate (which files it out and frees it outside r.mu), then
// the method proper.
func TestReadersRaceClose(t *testing.T) {
	const g = 1 << 16
	for _, tc := range []struct {
		name string
		opts Options
		op   func(r *Resource, b *buffer.Buffer) error
	}{
		{"Export", Options{HandleType: HandlePosixFD}, func(r *Resource, b *buffer.Buffer) error {
			chunks, err := r.Export(b)
			if err == nil {
				return errors.Join(errors.New("exported"), CloseChunkFDs(chunks))
			}
			return err
		}},
		{"ExportFabric", Options{HandleType: HandleFabric}, func(r *Resource, b *buffer.Buffer) error {
			_, err := r.ExportFabric(b)
			return err
		}},
		{"Info", Options{HandleType: HandleNone}, func(r *Resource, b *buffer.Buffer) error {
			_, err := r.Info(b)
			return err
		}},
		{"AllocationProperties", Options{HandleType: HandleNone}, func(r *Resource, b *buffer.Buffer) error {
			_, err := r.AllocationProperties(b)
			return err
		}},
		{"Access", Options{HandleType: HandleNone}, func(r *Resource, b *buffer.Buffer) error {
			_, err := r.Access(b, fakeDevice)
			return err
		}},
		{"SetPeerAccess", Options{HandleType: HandleNone}, func(r *Resource, b *buffer.Buffer) error {
			return r.SetPeerAccess(b, ReadWrite, fakePeer1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(g)
			lf := &lockedFake{f: f}
			r, err := newResource(lf, fakeDevice, &tc.opts)
			require.NoError(t, err)
			b, err := r.Allocate(4*g, nil)
			require.NoError(t, err)
			b, err = r.Grow(b, 8*g) // two chunks
			require.NoError(t, err)

			r.mu.Lock()
			var wg sync.WaitGroup
			var opErr, closeErr error
			wg.Add(2)
			go func() { defer wg.Done(); opErr = tc.op(r, b) }()
			time.Sleep(20 * time.Millisecond) // the method waits for r.mu in take
			go func() { defer wg.Done(); closeErr = b.Close() }()
			time.Sleep(20 * time.Millisecond) // Close's Deallocate waits for r.mu
			r.mu.Unlock()
			r.mu.Lock() // the woken method finds it held: starvation mode
			time.Sleep(5 * time.Millisecond)
			r.mu.Unlock()
			wg.Wait()

			require.NoError(t, closeErr)
			lf.mu.Lock()
			defer lf.mu.Unlock()
			require.Empty(t, f.bad, "the driver was handed freed handles or ranges; calls %v", f.log)
			require.Error(t, opErr, "%s succeeded on an allocation Close freed meanwhile", tc.name)
			// However the Close and the method's steps interleave, the
			// method meets a closed buffer: cuda.ErrClosed, never "not a
			// whole allocation" from looking up the address a closed
			// buffer reports.
			require.ErrorIs(t, opErr, cuda.ErrClosed)
			t.Logf("%s: %v", tc.name, opErr)
			require.NoError(t, r.Reclaim())
			f.requireEmpty(t)
		})
	}
}
