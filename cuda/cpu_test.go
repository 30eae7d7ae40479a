package cuda

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/loader"
)

func TestClosedStreamReturnsErrClosed(t *testing.T) {
	s := &Stream{dev: &Device{}, owned: true}
	s.guard.Close()
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
	e := &Event{dev: &Device{}}
	e.guard.Close()
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
	hi := uint64(0xdead_beef_0000_0000) // a variable: it does not fit a 32-bit uintptr
	assert.NoError(t, result(p, uintptr(hi)))
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

// fakeDevice is a device whose driver resolves nothing (every call returns
// loader.NotFound) but whose context is already "retained", so calls get
// past the Go-side checks and stop at the first driver call.
func fakeDevice() *Device {
	d := &Device{drv: &driver{}}
	d.setContext(1)
	d.defaultStream = Stream{dev: d}
	return d
}

// Stream.WaitStream with a zero stream dereferenced the zero stream's nil
// device and panicked.
func TestWaitStreamZeroStream(t *testing.T) {
	s := fakeDevice().DefaultStream()
	for _, other := range []*Stream{nil, {}, {owned: true}} {
		var err error
		require.NotPanics(t, func() { err = s.WaitStream(other) })
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.Contains(t, err.Error(), "Stream.WaitStream")
	}
	closed := &Stream{dev: fakeDevice(), owned: true}
	closed.guard.Close()
	assert.ErrorIs(t, s.WaitStream(closed), ErrClosed)
	assert.ErrorIs(t, closed.WaitStream(s), ErrClosed)
	// Both valid: the event creation fails (the fake resolves nothing) and
	// that error comes back, not a panic.
	err := s.WaitStream(fakeDevice().DefaultStream())
	assert.ErrorIs(t, err, ErrNotSupported)
}

// A nil *Event's Handle panicked.
func TestNilEventHandle(t *testing.T) {
	var e *Event
	assert.NotPanics(t, func() { assert.Zero(t, e.Handle()) })
	assert.Zero(t, (&Event{}).Handle())
}

// Most *Device methods on nil or zero values panicked.
func TestNilAndZeroDevice(t *testing.T) {
	for _, d := range []*Device{nil, {}} {
		assert.Equal(t, -1, d.Ordinal())
		assert.Equal(t, "GPU <nil>", d.String())
		_, err := d.Name()
		assert.ErrorIs(t, err, ErrInvalidArgument)
		_, err = d.UUID()
		assert.ErrorIs(t, err, ErrInvalidArgument)
		_, _, err = d.MemInfo()
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.Contains(t, err.Error(), "Device.MemInfo")
		_, err = d.MemAlloc(1)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		_, err = d.CanAccessPeer(fakeDevice())
		assert.ErrorIs(t, err, ErrInvalidArgument)
		_, err = fakeDevice().CanAccessPeer(d)
		assert.ErrorIs(t, err, ErrInvalidArgument, "a zero peer is not device 0")
		assert.ErrorIs(t, fakeDevice().EnablePeerAccess(d), ErrInvalidArgument)
		_, err = d.NewStream()
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.ErrorIs(t, d.DefaultStream().Sync(), ErrInvalidArgument)
	}
}

// Go-side checks for arguments that would reach the driver as NULL or 0.
func TestZeroArgumentsRefusedBeforeDriver(t *testing.T) {
	d := fakeDevice()
	s := d.DefaultStream()
	for name, err := range map[string]error{
		"MemAlloc(0)":             second(d.MemAlloc(0)),
		"MemAllocManaged(0)":      second(d.MemAllocManaged(0, MemAttachGlobal)),
		"MemHostAlloc(0)":         second(d.MemHostAlloc(0, 0)),
		"MemCreate(nil props)":    second(d.MemCreate(1<<21, nil)),
		"MemCreate(0)":            second(d.MemCreate(0, &MemAllocationProp{})),
		"AllocationGranularity":   second(d.AllocationGranularity(nil, 0)),
		"MemcpyHtoD(nil src)":     d.MemcpyHtoD(1, nil, 8),
		"MemcpyDtoH(nil dst)":     d.MemcpyDtoH(nil, 1, 8),
		"MemHostRegister(nil)":    d.MemHostRegister(nil, 8, 0),
		"MemcpyHtoDAsync(nil)":    s.MemcpyHtoDAsync(1, nil, 8),
		"MemcpyDtoHAsync(nil)":    s.MemcpyDtoHAsync(nil, 1, 8),
		"MemAllocAsync(0)":        second(s.MemAllocAsync(0)),
		"MemAllocFromPool(zero)":  second(s.MemAllocFromPoolAsync(MemPool{}, 8)),
		"MemcpyPeerAsync(zero)":   s.MemcpyPeerAsync(1, &Device{}, 2, d, 8),
		"ImportPointer(nil)":      second(MemPool{handle: 1, dev: d}.ImportPointer(nil)),
		"CreateMemPool(nil)":      second(d.CreateMemPool(nil)),
		"SetMemPool(zero)":        d.SetMemPool(MemPool{}),
		"LoadModule(empty)":       second(d.LoadModule(nil)),
		"Function.Launch(zero)":   (&Function{}).Launch(s, Dim3{}, Dim3{}, 0),
		"Function.Launch(nil)":    (*Function)(nil).Launch(s, Dim3{}, Dim3{}, 0),
		"Module.Function(zero)":   second((&Module{}).Function("k")),
		"Elapsed(nil, nil)":       second(Elapsed(nil, nil)),
		"Event.Record(nil)":       (&Event{}).Record(nil),
		"MemSetAccess(no descs)":  d.MemSetAccess(1, 1),
		"MemImportFD(-1)":         second(d.MemImportFD(-1)),
		"ImportMemPoolFD(-1)":     second(d.ImportMemPoolFD(-1)),
		"MemPool.SetAttr(flag 2)": MemPool{handle: 1, dev: d}.SetAttribute(MemPoolAttrReuseAllowOpportunistic, 2),
	} {
		assert.ErrorIs(t, err, ErrInvalidArgument, name)
	}
}

func second[T any](_ T, err error) error { return err }

// A closed module refuses lookups and launches of its kernels, which would
// otherwise hand the driver a dangling function handle.
func TestClosedModule(t *testing.T) {
	d := fakeDevice()
	m := &Module{dev: d, handle: 1}
	m.guard.Close()
	_, err := m.Function("k")
	assert.ErrorIs(t, err, ErrClosed)
	f := &Function{mod: m, name: "k", handle: 2}
	err = f.Launch(d.DefaultStream(), Dim3{X: 1}, Dim3{X: 1}, 0)
	assert.ErrorIs(t, err, ErrClosed)
	assert.Contains(t, err.Error(), "kernel k")
	assert.NoError(t, m.Close(), "Close is idempotent")
	// A kernel launched on another device's stream is refused in Go.
	open := &Module{dev: d, handle: 1}
	f = &Function{mod: open, name: "k", handle: 2}
	err = f.Launch(fakeDevice().DefaultStream(), Dim3{X: 1}, Dim3{X: 1}, 0)
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

// A driver that reports success with a negative fd must not hand it on.
func TestExportedFDBounds(t *testing.T) {
	fd, err := exportedFD("cuMemExportToShareableHandle", -1)
	assert.Equal(t, -1, fd)
	assert.ErrorIs(t, err, ErrorUnknown)
	assert.Contains(t, err.Error(), "-1")
	fd, err = exportedFD("x", 7)
	assert.NoError(t, err)
	assert.Equal(t, 7, fd)
}

func TestNilOpError(t *testing.T) {
	var e *OpError
	assert.Equal(t, "<nil>", e.Error())
	assert.Nil(t, e.Unwrap())
	assert.Equal(t, "op: <nil>", (&OpError{Op: "op"}).Error())
}

// Ranges that wrap past 2^64 are refused before the driver sees them: a
// driver takes an unknown address for pageable host memory and reads or
// writes wherever the sum lands (the fake driver crashed on cuMemcpyAsync
// from 0xfffffffffffffffc).
func TestWrappingRangesRefused(t *testing.T) {
	const top = DevicePtr(^uint64(0) - 3)
	s := &Stream{dev: &Device{}, owned: true}
	var b [16]byte
	for name, err := range map[string]error{
		"MemcpyAsync dst":     s.MemcpyAsync(top, 0x1000, 16),
		"MemcpyAsync src":     s.MemcpyAsync(0x1000, top, 16),
		"MemcpyHtoDAsync":     s.MemcpyHtoDAsync(top, unsafe.Pointer(&b[0]), 16),
		"MemcpyDtoHAsync":     s.MemcpyDtoHAsync(unsafe.Pointer(&b[0]), top, 16),
		"MemcpyDtoHAsync dst": s.MemcpyDtoHAsync(unsafe.Pointer(&b[0]), 0x1000, ^uint64(0)),
		"MemcpyPeerAsync":     s.MemcpyPeerAsync(top, nil, 0x1000, nil, 16),
		"MemsetD8Async":       s.MemsetD8Async(top, 0, 16),
		"MemsetD16Async":      s.MemsetD16Async(0x1000, 0, 1<<63),
		"MemsetD32Async":      s.MemsetD32Async(0x1000, 0, 1<<62),
		"MemPrefetchAsync":    s.MemPrefetchAsync(top, 16, MemLocation{}),
	} {
		require.Error(t, err, name)
		assert.ErrorIs(t, err, ErrInvalidArgument, name)
		assert.Contains(t, err.Error(), "2^64", name)
		assert.Contains(t, err.Error(), "cuMem", name)
	}
	assert.NoError(t, checkFill("cuMemsetD32Async", 0x1000, 1<<20, 4))
	assert.NoError(t, checkCopy("cuMemcpyAsync", 0, 0, 0))
}
