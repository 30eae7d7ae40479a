//go:build linux

package ipc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// devFD opens a character device (/dev/null, /dev/zero) and returns a
// descriptor the caller owns: a kind a pool export may be.
func devFD(t *testing.T, path string) int {
	t.Helper()
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	return fd
}

// rdevOf is the device number of the character device fd refers to.
func rdevOf(fd int) uint64 {
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil {
		return 0
	}
	return uint64(st.Rdev)
}

// fakeImports replaces the driver's pool import for the test: each call
// is counted by the device number of the fd it gets, and hold (when set)
// decides whether a call waits for release first. Every import succeeds
// with a fresh fake driver, unless fail says otherwise.
type fakeImports struct {
	mu      sync.Mutex
	calls   map[uint64]int
	hold    func(rdev uint64) bool
	fail    func(rdev uint64, call int) error
	entered chan uint64
	release chan struct{}
}

func installFakeImports(t *testing.T) *fakeImports {
	t.Helper()
	f := &fakeImports{calls: map[uint64]int{}, entered: make(chan uint64, 16), release: make(chan struct{})}
	old := importPoolFD
	importPoolFD = func(dev *cuda.Device, fd int) (cuda.MemPool, importDriver, error) {
		r := rdevOf(fd)
		f.mu.Lock()
		f.calls[r]++
		n := f.calls[r]
		hold, fail := f.hold, f.fail
		f.mu.Unlock()
		if hold != nil && hold(r) {
			f.entered <- r
			<-f.release
		}
		if fail != nil {
			if err := fail(r, n); err != nil {
				return cuda.MemPool{}, nil, err
			}
		}
		return cuda.MemPool{}, newFake(), nil
	}
	t.Cleanup(func() { importPoolFD = old })
	return f
}

func (f *fakeImports) count(rdev uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[rdev]
}

type importResult struct {
	p   *ImportedPool
	err error
}

func importAsync(dev *cuda.Device, h *Handle) <-chan importResult {
	out := make(chan importResult, 1)
	go func() {
		p, err := ImportPool(dev, h)
		out <- importResult{p, err}
	}()
	return out
}

// TestImportPoolOutsideTheLock: an import held inside the driver (as a
// slow or stuck cuMemPoolImportFromShareableHandle is) does not stall an
// import of another UUID, nor Lookup; a second import of the held UUID
// waits for the first and gets the same pool, with one driver import in
// all. Before, ImportPool held the registry's lock across the driver call,
// so every import and Lookup of the process waited for the slow one.
func TestImportPoolOutsideTheLock(t *testing.T) {
	before := testutil.FDs(t)
	f := installFakeImports(t)
	dev := &cuda.Device{}
	nullFD, zeroFD := devFD(t, "/dev/null"), devFD(t, "/dev/zero")
	held, free := rdevOf(nullFD), rdevOf(zeroFD)
	require.NotEqual(t, held, free)
	f.hold = func(r uint64) bool { return r == held }

	hA, err := NewHandle(nullFD, cuda.NewUUID().String())
	require.NoError(t, err)
	hA.key = newPoolKey()
	hB, err := NewHandle(zeroFD, cuda.NewUUID().String())
	require.NoError(t, err)
	hB.key = newPoolKey()

	first := importAsync(dev, hA)
	select {
	case <-f.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first import never reached the driver")
	}
	second := importAsync(dev, hA) // same UUID: waits for the first

	// Another UUID imports while the first is held in the driver.
	other := importAsync(dev, hB)
	var pB *ImportedPool
	select {
	case r := <-other:
		require.NoError(t, r.err)
		pB = r.p
	case <-time.After(10 * time.Second):
		t.Fatal("an import of another UUID waited for the held import")
	}
	got, ok := Lookup(hB.UUID())
	assert.True(t, ok, "Lookup answers while an import is held")
	assert.Same(t, pB, got)
	_, ok = Lookup(hA.UUID())
	assert.False(t, ok, "the held import is not registered yet")
	select {
	case r := <-second:
		t.Fatalf("the second import of the held UUID returned (%v, %v) before the first", r.p, r.err)
	case <-time.After(20 * time.Millisecond):
	}
	assert.Equal(t, 1, f.count(held), "the second import did not reach the driver")

	close(f.release)
	r1, r2 := <-first, <-second
	require.NoError(t, r1.err)
	require.NoError(t, r2.err)
	assert.Same(t, r1.p, r2.p, "one UUID, one pool")
	assert.Equal(t, 1, f.count(held), "mapped once")
	assert.Equal(t, 1, f.count(free))

	for _, p := range []*ImportedPool{r1.p, pB} {
		require.NoError(t, p.Close())
		assert.False(t, isRegistered(p), "destroyed and gone from the registry")
	}
	require.NoError(t, hA.Close())
	require.NoError(t, hB.Close())
	registry.Lock()
	assert.Empty(t, registry.pending, "no import left pending")
	registry.Unlock()
	testutil.AssertNoNewFDs(t, before, "the kept duplicates were closed")
}

// TestImportPoolConcurrentSameUUID: many goroutines import one UUID at
// once, the first driver import failing: the failure reaches its caller
// only, a waiter imports in turn, and every other caller gets that one
// pool (two driver imports in all, one pool mapped). Run with -race.
func TestImportPoolConcurrentSameUUID(t *testing.T) {
	before := testutil.FDs(t)
	f := installFakeImports(t)
	boom := errors.New("driver says no")
	f.fail = func(_ uint64, call int) error {
		if call == 1 {
			time.Sleep(5 * time.Millisecond) // let the others queue up
			return boom
		}
		return nil
	}
	dev := &cuda.Device{}
	nullFD := devFD(t, "/dev/null")
	null := rdevOf(nullFD)
	h, err := NewHandle(nullFD, cuda.NewUUID().String())
	require.NoError(t, err)
	h.key = newPoolKey()
	var wg sync.WaitGroup
	var failed atomic.Int32
	pools := make([]*ImportedPool, 16)
	for i := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := ImportPool(dev, h)
			if err != nil {
				assert.ErrorIs(t, err, boom)
				assert.Contains(t, err.Error(), "ipc.ImportPool")
				failed.Add(1)
				return
			}
			pools[i] = p
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), failed.Load(), "only the failed import's caller sees its error")
	var p *ImportedPool
	for _, q := range pools {
		if q == nil {
			continue
		}
		if p == nil {
			p = q
		}
		assert.Same(t, p, q)
	}
	require.NotNil(t, p)
	assert.Equal(t, 2, f.count(null), "one failed import, one that mapped")
	require.NoError(t, p.Close())
	require.NoError(t, h.Close())
	testutil.AssertNoNewFDs(t, before)
}

// TestImportPoolRefusesNonPoolFDs: an fd of a kind the driver's export
// never is (pipe, FIFO, socket, regular file, directory, memfd) is
// refused by ImportPool and by ReceiveHandle before the driver or a
// Handle takes it, with an error naming the operation, the fd and its
// kind; character devices and anonymous inodes go through.
func TestImportPoolRefusesNonPoolFDs(t *testing.T) {
	f := installFakeImports(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	regular := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(regular, []byte("not a pool"), 0o600))

	open := func(path string, flags int) func(t *testing.T) int {
		return func(t *testing.T) int {
			fd, err := syscall.Open(path, flags|syscall.O_CLOEXEC, 0)
			require.NoError(t, err)
			return fd
		}
	}
	refused := map[string]struct {
		make func(t *testing.T) int
		kind string
	}{
		"pipe": {func(t *testing.T) int { return pipeFDs(t, 1)[0] }, "pipe or FIFO"},
		"FIFO": {open(fifo, syscall.O_RDONLY|syscall.O_NONBLOCK), "pipe or FIFO"},
		"socket": {func(t *testing.T) int {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			require.NoError(t, syscall.Close(fds[1]))
			return fds[0]
		}, "socket"},
		"regular file": {open(regular, syscall.O_RDONLY), "regular file"},
		"directory":    {open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY), "directory"},
		"memfd": {func(t *testing.T) int {
			fd, err := unix.MemfdCreate("not-a-pool", unix.MFD_CLOEXEC)
			require.NoError(t, err)
			return fd
		}, "regular file"},
	}
	dev := &cuda.Device{}
	for name, c := range refused {
		t.Run(name, func(t *testing.T) {
			before := testutil.FDs(t)
			h, err := NewHandle(c.make(t), cuda.NewUUID().String())
			require.NoError(t, err)
			fd, _ := h.FD()
			_, err = ImportPool(dev, h)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "ipc.ImportPool")
			assert.Contains(t, err.Error(), c.kind)
			assert.Contains(t, err.Error(), "file descriptor "+strconv.Itoa(fd))
			_, ok := Lookup(h.UUID())
			assert.False(t, ok)

			// The same fd sent as a Handle is refused on arrival, and
			// closed.
			a, b := socketPair(t)
			h.key = newPoolKey()
			require.NoError(t, SendHandle(a, h))
			require.NoError(t, h.Close())
			got, err := ReceiveHandle(context.Background(), b)
			assert.Nil(t, got)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "ipc.ReceiveHandle")
			assert.Contains(t, err.Error(), c.kind)
			a.Close()
			b.Close()
			testutil.AssertNoNewFDs(t, before, "nothing kept")
		})
	}
	assert.Empty(t, f.calls, "no refused fd reached the driver")

	// Kinds the driver's export can be: a character device and an
	// anonymous inode (eventfd).
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	require.NoError(t, err)
	for name, fd := range map[string]int{"character device": devFD(t, "/dev/null"), "anonymous inode": efd} {
		h, err := NewHandle(fd, cuda.NewUUID().String())
		require.NoError(t, err, name)
		p, err := ImportPool(dev, h)
		require.NoError(t, err, name)
		require.NoError(t, p.Close())
		require.NoError(t, h.Close())
	}
}
