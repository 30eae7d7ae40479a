//go:build linux

package osfd

import (
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// pipeFD returns a fresh descriptor (the read end of a pipe) the caller owns.
func pipeFD(t *testing.T) int {
	t.Helper()
	var p [2]int
	require.NoError(t, syscall.Pipe(p[:]))
	require.NoError(t, syscall.Close(p[1]))
	return p[0]
}

func isOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

func cloexec(t *testing.T, fd int) bool {
	r, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err)
	return r&unix.FD_CLOEXEC != 0
}

// TestNewSetsCloseOnExec: a descriptor New takes (an inherited one, say,
// which arrives without the flag) becomes close-on-exec, so it does not
// pass on to this process's children; a failure to take it leaves the
// flag alone.
func TestNewSetsCloseOnExec(t *testing.T) {
	before := testutil.FDs(t)
	fd := pipeFD(t)
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0)
	require.NoError(t, err)
	require.False(t, cloexec(t, fd), "the test's descriptor starts without the flag")
	f, err := New(fd)
	require.NoError(t, err)
	assert.True(t, cloexec(t, fd), "New set close-on-exec")
	require.NoError(t, f.Close())
	testutil.AssertNoNewFDs(t, before)

	_, err = New(1 << 20) // not open: refused, nothing set
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestFileLifecycle(t *testing.T) {
	before := testutil.FDs(t)
	fd := pipeFD(t)
	f, err := New(fd)
	require.NoError(t, err)
	got, err := f.Int()
	require.NoError(t, err)
	assert.Equal(t, fd, got)
	assert.True(t, f.IsOpen())

	d, err := f.Dup()
	require.NoError(t, err)
	dfd, err := d.Int()
	require.NoError(t, err)
	assert.NotEqual(t, fd, dfd)
	assert.True(t, cloexec(t, dfd), "duplicates are close-on-exec")

	o, err := f.OSFile("x")
	require.NoError(t, err)
	assert.True(t, cloexec(t, int(o.Fd())))
	require.NoError(t, o.Close())

	require.NoError(t, f.Close())
	assert.False(t, isOpen(fd))
	require.NoError(t, f.Close(), "Close is idempotent")
	_, err = f.Int()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = f.Dup()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	assert.ErrorIs(t, f.Use(func(int) error { return nil }), cuda.ErrClosed)
	_, err = f.Release()
	assert.ErrorIs(t, err, cuda.ErrClosed)

	rfd, err := d.Release()
	require.NoError(t, err)
	assert.Equal(t, dfd, rfd)
	require.NoError(t, d.Close(), "a released File closes nothing")
	assert.True(t, isOpen(rfd))
	require.NoError(t, Close(rfd))
	testutil.AssertNoNewFDs(t, before)

	_, err = New(-1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.ErrorIs(t, Close(-3), cuda.ErrInvalidArgument)
	_, err = DupInt(-1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// TestZeroFileNeverClosesStdin: the zero File owns nothing; Close must not
// close descriptor 0.
func TestZeroFileNeverClosesStdin(t *testing.T) {
	// Make sure descriptor 0 is open so closing it would be observable.
	if !isOpen(0) {
		fd := pipeFD(t)
		require.NoError(t, syscall.Dup3(fd, 0, 0))
		require.NoError(t, syscall.Close(fd))
	}
	for name, f := range map[string]*File{"nil": nil, "zero": {}} {
		assert.NoError(t, f.Close(), name)
		assert.True(t, isOpen(0), "%s: fd 0 still open", name)
		_, err := f.Int()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		_, err = f.Dup()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		_, err = f.Release()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		_, err = f.OSFile("x")
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		assert.ErrorIs(t, f.Use(func(int) error { return nil }), cuda.ErrInvalidArgument, name)
		assert.False(t, f.IsOpen())
		assert.NotEmpty(t, f.String())
	}
}

// TestCloseWaitsForUse: Close cannot close the descriptor under a Use.
func TestCloseWaitsForUse(t *testing.T) {
	f, err := New(pipeFD(t))
	require.NoError(t, err)
	inUse, release := make(chan int), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, f.Use(func(fd int) error {
			inUse <- fd
			<-release
			assert.True(t, isOpen(fd), "open for the whole of Use")
			return nil
		}))
	}()
	fd := <-inUse
	closed := make(chan struct{})
	go func() { assert.NoError(t, f.Close()); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while the descriptor was in use")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	wg.Wait()
	<-closed
	assert.False(t, isOpen(fd))
}

func TestConcurrentClose(t *testing.T) {
	before := testutil.FDs(t)
	f, err := New(pipeFD(t))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, f.Close()) }()
	}
	wg.Wait()
	testutil.AssertNoNewFDs(t, before)
}

// TestLeakSafetyNet: a File lost without Close has its descriptor closed
// by the cleanup and counted.
func TestLeakSafetyNet(t *testing.T) {
	before, leaksBefore := testutil.FDs(t), Leaks()
	func() {
		for range 8 {
			_, err := New(pipeFD(t))
			require.NoError(t, err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for Leaks() < leaksBefore+8 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, leaksBefore+8, Leaks())
	testutil.AssertNoNewFDs(t, before, "leaked descriptors were closed")
}

func TestCloseAllJoins(t *testing.T) {
	a, b := pipeFD(t), 1<<20 // b is far above any open descriptor
	err := CloseAll([]int{a, b})
	require.Error(t, err, "closing a number that is not open fails")
	assert.Contains(t, err.Error(), "file descriptor")
	assert.False(t, isOpen(a), "the good one was closed anyway")
}
