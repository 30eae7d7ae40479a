package ipc

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// These tests pin the lifecycle ImportedPool takes from internal/poolcore:
// calls in progress hold the pool open, Close waits for them, and a failed
// destruction is kept for the next Close.

// late reports the fake's driver calls made after the pool was destroyed.
func (f *fakeImport) late() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lateCalls
}

// holdNextImport makes the next importPointer call block once it began;
// the returned function lets it go on.
func (f *fakeImport) holdNextImport() (entered <-chan struct{}, let func()) {
	in, rel := make(chan struct{}, 1), make(chan struct{})
	f.mu.Lock()
	f.entered, f.release = in, rel
	f.mu.Unlock()
	return in, func() { close(rel) }
}

// closeAsync runs p.Close in a goroutine; its result arrives on the channel.
func closeAsync(p *ImportedPool) <-chan error {
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	return done
}

// waitClosed waits until Close has begun on p.
func waitClosed(t *testing.T, p *ImportedPool) {
	t.Helper()
	require.Eventually(t, p.IsClosed, 5*time.Second, time.Millisecond, "Close began")
}

// TestCloseWaitsForImport: a Close that starts while an Import is in the
// driver waits for it; imports that start after Close began fail with
// ErrClosed without reaching the driver; the Buffer the held Import
// returns works, and the pool is destroyed after it, not under it.
func TestCloseWaitsForImport(t *testing.T) {
	p, f := fakePool(t)
	entered, let := f.holdNextImport()
	type result struct {
		b   *buffer.Buffer
		err error
	}
	got := make(chan result, 1)
	go func() {
		b, err := p.Import(desc(p, 1, 4096, 4096), nil)
		got <- result{b, err}
	}()
	<-entered
	done := closeAsync(p)
	waitClosed(t, p)

	_, err := p.Import(desc(p, 2, 4096, 4096), nil)
	assert.ErrorIs(t, err, cuda.ErrClosed, "an Import after Close began")
	f.mu.Lock()
	imports := f.imports
	f.mu.Unlock()
	assert.Zero(t, imports, "the refused Import made no driver call (the held one has not counted yet)")
	_, err = ExportPool(p)
	assert.ErrorIs(t, err, cuda.ErrClosed, "an Export after Close began")
	assert.True(t, p.Pool().IsZero(), "Pool is zero once closed")

	select {
	case err := <-done:
		t.Fatalf("Close returned (%v) while an Import was in the driver", err)
	case <-time.After(50 * time.Millisecond):
	}
	_, _, destroyed := f.counts()
	assert.Zero(t, destroyed, "nothing destroyed under the Import")

	let()
	r := <-got
	require.NoError(t, r.err, "the Import in progress completes")
	require.NoError(t, <-done)
	assert.True(t, f.mapped(r.b.Ptr()), "its Buffer is mapped after Close")
	assert.Equal(t, int64(1), p.Live())
	_, _, destroyed = f.counts()
	assert.Zero(t, destroyed, "the closed pool lives while its Buffer does")

	require.NoError(t, r.b.Close())
	frees, bad, destroyed := f.counts()
	assert.Equal(t, 1, frees)
	assert.Zero(t, bad)
	assert.Equal(t, 1, destroyed, "the last Buffer destroyed the pool")
	assert.Zero(t, f.late(), "no driver call after the destruction")
}

// TestCloseRacesImports: Close while many goroutines import (duplicates
// included) and close Buffers. Every Import either succeeds with a mapped
// Buffer or fails with ErrClosed; nothing is freed twice, nothing reaches
// the driver after the destruction, and the pool is destroyed exactly
// once, after the last Buffer.
func TestCloseRacesImports(t *testing.T) {
	for round := range 20 {
		p, f := fakePool(t)
		descs := []Descriptor{desc(p, 1, 1<<20, 1<<20), desc(p, 2, 4096, 4096), desc(p, 1, 1<<20, 4096)}
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			kept []*buffer.Buffer
		)
		start := make(chan struct{})
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; ; i++ {
					b, err := p.Import(descs[(g+i)%len(descs)], nil)
					if err != nil {
						assert.ErrorIs(t, err, cuda.ErrClosed, "round %d", round)
						return
					}
					if !assert.True(t, f.mapped(b.Ptr()), "a returned Buffer is mapped") {
						return
					}
					if i%2 == 0 {
						assert.NoError(t, b.Close())
					} else {
						mu.Lock()
						kept = append(kept, b) // closed after the pool
						mu.Unlock()
					}
				}
			}()
		}
		close(start)
		time.Sleep(time.Duration(round%4) * time.Millisecond)
		require.NoError(t, p.Close())
		wg.Wait()
		for _, b := range kept {
			assert.True(t, f.mapped(b.Ptr()), "a Buffer outlives the pool's Close")
		}
		if len(kept) > 0 {
			_, _, destroyed := f.counts()
			assert.Zero(t, destroyed, "not destroyed while Buffers are open")
		}
		for _, b := range kept {
			require.NoError(t, b.Close())
		}
		_, bad, destroyed := f.counts()
		assert.Zero(t, bad, "no pointer freed twice")
		assert.Equal(t, 1, destroyed, "destroyed once, after the last Buffer")
		assert.Zero(t, f.late(), "no driver call after the destruction")
		assert.Zero(t, p.Live())
		f.mu.Lock()
		assert.Empty(t, f.size, "nothing left mapped")
		f.mu.Unlock()
	}
}

// TestDeferredDestroyErrorNextClose: when the last Buffer of a closed pool
// fails to destroy it, that Buffer's Close still succeeds (its free did),
// the next Close reports the failure and retries, and a Close after a
// successful retry destroys nothing again.
func TestDeferredDestroyErrorNextClose(t *testing.T) {
	p, f := fakePool(t)
	b, err := p.Import(desc(p, 1, 4096, 4096), nil)
	require.NoError(t, err)
	require.NoError(t, p.Close(), "nothing to destroy yet: a Buffer is live")
	injected := errors.New("injected destroy failure")
	f.mu.Lock()
	f.failDestroy = injected
	f.mu.Unlock()

	require.NoError(t, b.Close(), "the free succeeded: the Buffer is closed")
	assert.True(t, b.IsClosed())
	_, _, destroyed := f.counts()
	require.Equal(t, 1, destroyed, "the last Buffer tried to destroy the pool")

	err = p.Close()
	require.ErrorIs(t, err, injected, "the next Close reports the deferred failure")
	var oe *cuda.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "ImportedPool.Close", oe.Op)
	_, _, destroyed = f.counts()
	assert.Equal(t, 2, destroyed, "and retried it")

	f.mu.Lock()
	f.failDestroy = nil
	f.mu.Unlock()
	require.NoError(t, p.Close(), "a retry that works")
	require.NoError(t, p.Close())
	_, _, destroyed = f.counts()
	assert.Equal(t, 3, destroyed, "no destruction after the successful one")
	assert.Zero(t, f.late())

	// The same when the destruction fails in Close itself (nothing live).
	p, f = fakePool(t)
	f.failDestroy = injected
	require.ErrorIs(t, p.Close(), injected)
	require.ErrorIs(t, p.Close(), injected, "still failing: reported again")
	f.mu.Lock()
	f.failDestroy = nil
	f.mu.Unlock()
	require.NoError(t, p.Close())
	_, _, destroyed = f.counts()
	assert.Equal(t, 3, destroyed)
	_, err = p.Import(desc(p, 1, 4096, 4096), nil)
	assert.ErrorIs(t, err, cuda.ErrClosed, "closed whatever the destruction did")
}

// keptFile returns an osfd.File on one end of a new pipe (the other end
// is closed), standing in for the imported pool's fd.
func keptFile(t *testing.T) *osfd.File {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	require.NoError(t, w.Close())
	f, err := osfd.DupInt(int(r.Fd()))
	require.NoError(t, err)
	require.NoError(t, r.Close())
	return f
}

// TestCloseWaitsForExport: Close does not close the kept fd while a call
// holds the pool (an Export duplicating it), closes it once after, and
// concurrent Exports either return an open Handle or ErrClosed.
func TestCloseWaitsForExport(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no POSIX descriptors")
	}
	before := testutil.OpenFDs()
	file := keptFile(t)
	p := newImportedPool(nil, cuda.MemPool{}, newFake(), cuda.NewUUID(), newPoolKey(), file)

	// A call in progress, as Export is between Enter and Leave.
	require.True(t, p.life.Enter())
	done := closeAsync(p)
	waitClosed(t, p)
	select {
	case err := <-done:
		t.Fatalf("Close returned (%v) during a call on the pool", err)
	case <-time.After(50 * time.Millisecond):
	}
	assert.True(t, file.IsOpen(), "the kept fd stays open under the call")
	p.life.Leave()
	require.NoError(t, <-done)
	assert.False(t, file.IsOpen(), "closed once the call ended")
	require.NoError(t, p.Close(), "idempotent")

	// Exports racing Close.
	p = newImportedPool(nil, cuda.MemPool{}, newFake(), cuda.NewUUID(), newPoolKey(), keptFile(t))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				h, err := ExportPool(p)
				if err != nil {
					assert.ErrorIs(t, err, cuda.ErrClosed)
					return
				}
				_, err = h.FD()
				assert.NoError(t, err, "an exported Handle owns an open fd")
				assert.Equal(t, p.UUID(), h.UUID())
				assert.NoError(t, h.Close())
			}
		}()
	}
	time.Sleep(2 * time.Millisecond)
	require.NoError(t, p.Close())
	wg.Wait()
	testutil.AssertNoNewFDs(t, before, "every descriptor closed")
	assert.Zero(t, osfd.Leaks())
}

// register puts p in the registry, as ImportPool does.
func register(p *ImportedPool) {
	registry.Lock()
	defer registry.Unlock()
	if registry.pools == nil {
		registry.pools = map[UUID]*ImportedPool{}
	}
	registry.pools[p.uuid] = p
}

func isRegistered(p *ImportedPool) bool {
	registry.Lock()
	defer registry.Unlock()
	return registry.pools[p.uuid] == p
}

// TestCloseLeavesRegistry: a closed pool leaves the registry when it is
// destroyed (at once with no Buffer open), never another pool that took
// its UUID.
func TestCloseLeavesRegistry(t *testing.T) {
	p, _ := fakePool(t)
	register(p)
	got, ok := Lookup(p.UUID())
	require.True(t, ok)
	assert.Same(t, p, got)
	registry.Lock()
	got, err := registered("test", nil, p.uuid, p.key)
	registry.Unlock()
	require.NoError(t, err)
	assert.Same(t, p, got, "an open pool is returned to ImportPool")
	require.NoError(t, p.Close())
	_, ok = Lookup(p.UUID())
	assert.False(t, ok, "a closed pool leaves the registry")
	assert.False(t, isRegistered(p))

	q, _ := fakePool(t)
	q2 := newImportedPool(nil, cuda.MemPool{}, newFake(), q.uuid, q.key, nil)
	register(q2)
	require.NoError(t, q.Close())
	got, ok = Lookup(q.uuid)
	assert.True(t, ok && got == q2, "the newer import of the UUID stays registered")
	require.NoError(t, q2.Close())
	_, ok = Lookup(q.uuid)
	assert.False(t, ok)
}

// TestReimportWhileBuffersOpen: a closed pool whose Buffers are still open
// stays registered, and importing its UUID again is refused (ErrClosed):
// the driver maps an allocation once per process, so a second pool's
// Import could return the very pointer an old Buffer holds, and either
// side's Close would unmap it under the other (the fake driver behaves
// so). After the last Buffer the pool is destroyed and the UUID is free;
// a failed destruction keeps it refused until a Close retries it.
func TestReimportWhileBuffersOpen(t *testing.T) {
	p, f := fakePool(t)
	register(p)
	b, err := p.Import(desc(p, 1, 4096, 4096), nil)
	require.NoError(t, err)
	require.NoError(t, p.Close())
	_, ok := Lookup(p.uuid)
	assert.False(t, ok, "Lookup returns open pools only")
	assert.True(t, isRegistered(p), "kept while its Buffer is open")
	registry.Lock()
	got, err := registered("ipc.ImportPool", nil, p.uuid, p.key)
	registry.Unlock()
	assert.Nil(t, got)
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), p.uuid.String())

	f.mu.Lock()
	f.failDestroy = errors.New("injected destroy failure")
	f.mu.Unlock()
	require.NoError(t, b.Close())
	assert.True(t, isRegistered(p), "a failed destruction keeps the pool registered")
	registry.Lock()
	_, err = registered("ipc.ImportPool", nil, p.uuid, p.key)
	registry.Unlock()
	require.ErrorIs(t, err, cuda.ErrClosed)

	f.mu.Lock()
	f.failDestroy = nil
	f.mu.Unlock()
	require.NoError(t, p.Close(), "the retry destroys it")
	assert.False(t, isRegistered(p), "and the UUID is free")
	registry.Lock()
	got, err = registered("ipc.ImportPool", nil, p.uuid, p.key)
	registry.Unlock()
	assert.Nil(t, got)
	assert.NoError(t, err, "ImportPool would map it afresh")
}

// TestDestroyRefusedByAnEndedCapture: a destroy refused because a capture
// began after the check, which has ended by the time the refusal is looked
// at, is tried again at once: Close succeeds and the pool is destroyed
// (it used to return ErrCapturing and leave the pool for the next Close).
func TestDestroyRefusedByAnEndedCapture(t *testing.T) {
	p, f := fakePool(t)
	f.capturedDestroys = 1
	require.NoError(t, p.Close())
	_, _, destroyed := f.counts()
	assert.Equal(t, 2, destroyed, "refused once, then destroyed")
	assert.True(t, f.gone)
}
