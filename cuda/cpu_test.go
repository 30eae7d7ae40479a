package cuda

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/loader"
)

func TestClosedStreamReturnsErrClosed(t *testing.T) {
	s := &Stream{dev: &Device{}, owned: true, closed: true}
	for name, err := range map[string]error{
		"Sync":           s.Sync(),
		"MemsetD32Async": s.MemsetD32Async(0, 0, 1),
		"MemcpyAsync":    s.MemcpyAsync(0, 0, 1),
		"MemFreeAsync":   s.MemFreeAsync(0),
		"WaitEvent":      s.WaitEvent(&Event{}),
		"Close twice":    nil,
	} {
		if name == "Close twice" {
			assert.NoError(t, s.Close(), "Close is idempotent")
			continue
		}
		require.Error(t, err, name)
		assert.ErrorIs(t, err, ErrClosed, name)
		var oe *OpError
		assert.True(t, errors.As(err, &oe), "%s: error names its operation", name)
	}
	_, err := s.MemAllocFromPoolAsync(MemPool{}, 16)
	assert.ErrorIs(t, err, ErrClosed)
}

func TestNilStreamAndEvent(t *testing.T) {
	var s *Stream
	err := s.Sync()
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "nil or zero stream")
	assert.NoError(t, s.Close())
	var e *Event
	assert.ErrorIs(t, e.Sync(), ErrInvalidArgument)
	assert.NoError(t, e.Close())
}

func TestClosedEventReturnsErrClosed(t *testing.T) {
	e := &Event{dev: &Device{}, closed: true}
	assert.ErrorIs(t, e.Sync(), ErrClosed)
	assert.ErrorIs(t, e.Record(&Stream{dev: &Device{}}), ErrClosed)
	_, err := e.Done()
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, e.Close())
}

func TestZeroPoolRejected(t *testing.T) {
	var p MemPool
	_, err := p.Attribute(MemPoolAttrUsedMemCurrent)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "cuMemPoolGetAttribute")
	assert.ErrorIs(t, p.Destroy(), ErrInvalidArgument)
}

func TestFailNamesEntryPoint(t *testing.T) {
	p := &loader.Proc{}
	err := fail(p, loader.NotFound)
	assert.ErrorIs(t, err, ErrNotSupported)
	err = result(p, uintptr(ErrorOutOfMemory))
	assert.ErrorIs(t, err, ErrorOutOfMemory)
	// Only the low 32 bits of the result register are the CUresult.
	assert.NoError(t, result(p, 0xdead_beef_0000_0000))
	err = sizeErr(&OpError{Op: "cuMemAlloc", Err: ErrorOutOfMemory}, 1<<40)
	assert.ErrorIs(t, err, ErrorOutOfMemory)
	assert.Equal(t, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (1099511627776 bytes (1 TiB) requested)", err.Error())
}

func TestFormatSize(t *testing.T) {
	assert.Equal(t, "0 bytes", formatSize(0))
	assert.Equal(t, "1023 bytes", formatSize(1023))
	assert.Equal(t, "2097152 bytes (2 MiB)", formatSize(2<<20))
	assert.Equal(t, "1536 bytes (1.5 KiB)", formatSize(1536))
}

func TestVersionString(t *testing.T) {
	assert.Equal(t, "13.0", VersionString(13000))
	assert.Equal(t, "12.8", VersionString(12080))
}

func TestNegativeOrdinalRejectedWithoutDriver(t *testing.T) {
	_, err := GetDevice(-1)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "-1")
}

func TestZeroValuesRejected(t *testing.T) {
	var s Stream
	assert.ErrorIs(t, s.Sync(), ErrInvalidArgument)
	assert.NoError(t, s.Close())
	var e Event
	assert.ErrorIs(t, e.Sync(), ErrInvalidArgument)
	assert.NoError(t, e.Close())
	var ns *Stream
	assert.Nil(t, ns.Device())
	assert.Zero(t, ns.Handle())
	d := &Device{}
	assert.ErrorIs(t, d.EnablePeerAccess(nil), ErrInvalidArgument)
}
