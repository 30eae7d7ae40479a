package resource_test

import (
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// poolUser is DevicePool and PinnedPool as Use sees them.
type poolUser interface {
	Use(fn func(pool cuda.MemPool) error) error
	Close() error
	IsClosed() bool
}

// Both pool kinds offer Use, which package ipc calls from ExportPool.
var (
	_ poolUser = (*resource.DevicePool)(nil)
	_ poolUser = (*resource.PinnedPool)(nil)
)

// checkUseAgainstClose runs Use with a callback that blocks while Close is
// called from another goroutine: Close must wait for the callback, the
// pool must stay valid (driver calls on it succeed) until the callback
// returns, and Use afterwards must fail with ErrClosed naming op.
func checkUseAgainstClose(t *testing.T, p poolUser, op string) {
	entered := make(chan struct{})
	proceed := make(chan struct{})
	var closeDone atomic.Bool
	useErr := make(chan error, 1)
	go func() {
		useErr <- p.Use(func(pool cuda.MemPool) error {
			close(entered)
			<-proceed
			// Close has begun (IsClosed) but must not have destroyed the
			// pool: a driver call on it works.
			_, err := pool.Attribute(cuda.MemPoolAttrReservedMemCurrent)
			return err
		})
	}()
	<-entered
	closeErr := make(chan error, 1)
	go func() {
		closeErr <- p.Close()
		closeDone.Store(true)
	}()
	for !p.IsClosed() {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	assert.False(t, closeDone.Load(), "Close returned while Use's callback was running")
	close(proceed)
	require.NoError(t, <-useErr, "a driver call on the pool inside Use after Close began")
	require.NoError(t, <-closeErr)
	err := p.Use(func(cuda.MemPool) error {
		t.Error("Use called its callback after Close")
		return nil
	})
	require.ErrorIs(t, err, cuda.ErrClosed)
	assert.Contains(t, err.Error(), op)
}

func TestDevicePoolUseConcurrentClose(t *testing.T) {
	dev := cudatest.Device(t)
	p, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{})
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	checkUseAgainstClose(t, p, "DevicePool.Use")
}

func TestPinnedPoolUseConcurrentClose(t *testing.T) {
	cudatest.Device(t)
	p, err := resource.NewPinnedPool(nil)
	cudatest.SkipIfNotSupported(t, err)
	require.NoError(t, err)
	checkUseAgainstClose(t, p, "PinnedPool.Use")
}

// TestDevicePoolUseErrors: fn's error comes back; a nil fn is refused.
func TestDevicePoolUseErrors(t *testing.T) {
	dev := cudatest.Device(t)
	p := ownedPool(t, dev, &resource.DevicePoolOptions{})
	boom := errors.New("boom")
	require.ErrorIs(t, p.Use(func(pool cuda.MemPool) error {
		assert.Equal(t, p.Pool(), pool)
		return boom
	}), boom)
	require.ErrorIs(t, p.Use(nil), cuda.ErrInvalidArgument)
}

// TestDevicePoolForeignDeallocate: freeing through a pool memory it never
// handed out is refused without calling the driver, and the owner's
// buffer stays intact.
func TestDevicePoolForeignDeallocate(t *testing.T) {
	dev := cudatest.Device(t)
	a := ownedPool(t, dev, &resource.DevicePoolOptions{})
	b := ownedPool(t, dev, &resource.DevicePoolOptions{})
	buf, err := a.Allocate(4096, nil)
	require.NoError(t, err)
	err = b.Deallocate(buf.Ptr(), 4096, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "DevicePool.Deallocate")
	attrs, err := a.Attributes()
	require.NoError(t, err)
	assert.NotZero(t, attrs.UsedMemCurrent, "the owner's memory was freed")
	require.NoError(t, buf.Close())
}

// TestPoolStreamChecks: a zero stream, and a stream of another device,
// are refused with clear errors.
func TestPoolStreamChecks(t *testing.T) {
	dev := cudatest.Device(t)
	p := ownedPool(t, dev, &resource.DevicePoolOptions{})
	_, err := p.Allocate(4096, &cuda.Stream{})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "zero stream")
	sd, err := resource.NewSyncDevice(dev)
	require.NoError(t, err)
	_, err = sd.Allocate(4096, &cuda.Stream{})
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = p.Allocate(math.MaxUint64, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "18446744073709551615")
}

func TestDevicePoolOtherDeviceStream(t *testing.T) {
	devs := cudatest.Devices(t, 2)
	p := ownedPool(t, devs[0], &resource.DevicePoolOptions{})
	s := cudatest.Stream(t, devs[1])
	_, err := p.Allocate(4096, s)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), devs[1].String())
	assert.Contains(t, err.Error(), devs[0].String())
}

// TestNewDevicePoolFailedReserveRollsBack: a reserve the device cannot
// hold fails the constructor, which destroys the pool it created (the
// error would say "leaked" otherwise), and the device still works.
func TestNewDevicePoolFailedReserveRollsBack(t *testing.T) {
	dev := cudatest.Device(t)
	_, err := resource.NewDevicePool(dev, &resource.DevicePoolOptions{InitialReserve: 1 << 50})
	cudatest.SkipIfNotSupported(t, err)
	require.Error(t, err)
	t.Log(err)
	assert.NotContains(t, err.Error(), "leaked")
	assert.Contains(t, err.Error(), "initial reserve")
	p := ownedPool(t, dev, &resource.DevicePoolOptions{})
	b, err := p.Allocate(4096, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
}
