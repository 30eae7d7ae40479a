package cuda

import (
	"os"
	"reflect"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/loader"
)

// Physical allocation handle 0 is refused before any driver call, as the
// package docs promise for zero arguments (MemImportFabric already
// refused a zero fabric handle). fakeDevice resolves nothing: a call that
// reached the driver would report ErrNotSupported instead.
func TestZeroMemHandleRefusedBeforeTheDriver(t *testing.T) {
	d := fakeDevice()
	for _, c := range []struct {
		op   string
		call func() error
	}{
		{"cuMemRelease", func() error { return d.MemRelease(0) }},
		{"cuMemMap", func() error { return d.MemMap(0x10000, 4096, 0, 0) }},
		{"cuMemExportToShareableHandle", func() error { _, err := d.MemExportFD(0); return err }},
		{"cuMemExportToShareableHandle", func() error { _, err := d.MemExportFabric(0); return err }},
		{"cuMemGetAllocationPropertiesFromHandle", func() error { _, err := d.MemAllocationProperties(0); return err }},
	} {
		err := c.call()
		require.ErrorIs(t, err, ErrInvalidArgument, c.op)
		assert.NotErrorIs(t, err, ErrNotSupported, "%s reached the driver", c.op)
		assert.Contains(t, err.Error(), c.op)
		assert.Contains(t, err.Error(), "handle 0")
	}
	fd, err := d.MemExportFD(0)
	assert.Equal(t, -1, fd, "no descriptor with the error")
	assert.Error(t, err)
}

// zeroingDevice returns device 0 of a copy of fk's driver in which the
// entry point pick chooses is replaced by a C function that returns
// CUDA_SUCCESS and writes nothing (libc's sched_yield, whose extra
// arguments the C calling convention ignores): a driver that reports
// success but hands back a zero handle.
func zeroingDevice(t *testing.T, fk *ctxFake, pick func(*driver) *loader.Proc) *Device {
	t.Helper()
	libc, err := loader.OpenLibrary("libc.so.6")
	require.NoError(t, err)
	yield, err := libc.Lookup("sched_yield")
	require.NoError(t, err)
	drv := *fk.devs[0].drv
	*pick(&drv) = drv.Bind(yield)
	ds, err := enumerate(&drv)
	require.NoError(t, err)
	return ds[0]
}

// A create or import whose driver call reports success with handle 0 is
// an error matching ErrorUnknown naming the entry point, never a zero
// handle (which later calls would refuse, or the driver take as NULL: an
// owned stream with handle 0 would even be the legacy stream, destroyed
// by its Close).
func TestSuccessWithZeroHandleIsAnError(t *testing.T) {
	fk := newCtxFake(t, "13000")
	fh := MemFabricHandle{}
	fh.Data[0] = 1
	prop := &MemAllocationProp{Type: MemAllocationTypePinned, Location: MemLocation{Type: MemLocationTypeDevice}}
	for _, c := range []struct {
		name string // the entry point, named in the error
		pick func(*driver) *loader.Proc
		call func(d *Device) (any, error)
	}{
		{"cuMemCreate", func(l *driver) *loader.Proc { return &l.MemCreate },
			func(d *Device) (any, error) { return d.MemCreate(2<<20, prop) }},
		{"cuMemImportFromShareableHandle", func(l *driver) *loader.Proc { return &l.MemImportFromShareableHandle },
			func(d *Device) (any, error) { return d.MemImportFD(int(os.Stdin.Fd())) }},
		{"cuMemImportFromShareableHandle", func(l *driver) *loader.Proc { return &l.MemImportFromShareableHandle },
			func(d *Device) (any, error) { return d.MemImportFabric(&fh) }},
		{"cuMemRetainAllocationHandle", func(l *driver) *loader.Proc { return &l.MemRetainAllocationHandle },
			func(d *Device) (any, error) { return d.MemRetainAllocationHandle(0x10000) }},
		{"cuMemPoolImportFromShareableHandle", func(l *driver) *loader.Proc { return &l.MemPoolImportFromShareableHandle },
			func(d *Device) (any, error) { return d.ImportMemPoolFabric(&fh) }},
		{"cuMemPoolCreate", func(l *driver) *loader.Proc { return &l.MemPoolCreate },
			func(d *Device) (any, error) {
				return d.CreateMemPool(&MemPoolProps{AllocType: MemAllocationTypePinned, Location: MemLocation{Type: MemLocationTypeDevice}})
			}},
		{"cuMemPoolImportFromShareableHandle", func(l *driver) *loader.Proc { return &l.MemPoolImportFromShareableHandle },
			func(d *Device) (any, error) { return d.ImportMemPoolFD(int(os.Stdin.Fd())) }},
		{"cuStreamCreateWithPriority", func(l *driver) *loader.Proc { return &l.StreamCreateWithPriority },
			func(d *Device) (any, error) { return d.NewStream() }},
		{"cuEventCreate", func(l *driver) *loader.Proc { return &l.EventCreate },
			func(d *Device) (any, error) { return d.NewEvent(EventDisableTiming) }},
		{"cuModuleLoadData", func(l *driver) *loader.Proc { return &l.ModuleLoadData },
			func(d *Device) (any, error) { return d.LoadModule([]byte("ptx")) }},
		{"cuGraphInstantiateWithFlags", func(l *driver) *loader.Proc { return &l.GraphInstantiateWithFlags },
			func(d *Device) (any, error) {
				s, err := d.NewStream()
				require.NoError(t, err)
				defer s.Close()
				require.NoError(t, s.BeginCapture())
				g, err := s.EndCapture()
				require.NoError(t, err)
				defer g.Close()
				return g.Instantiate(0)
			}},
	} {
		d := zeroingDevice(t, fk, c.pick)
		v, err := c.call(d)
		require.ErrorIs(t, err, ErrorUnknown, c.name)
		assert.Contains(t, err.Error(), c.name)
		assert.Contains(t, err.Error(), "reported success but returned")
		switch v := v.(type) {
		case MemHandle:
			assert.Zero(t, v)
		case MemPool:
			assert.True(t, v.IsZero(), c.name)
		default: // a *Stream, *Event, *Module or *GraphExec: none
			rv := reflect.ValueOf(v)
			assert.True(t, rv.Kind() == reflect.Pointer && rv.IsNil(), "%s returned %v", c.name, v)
		}
	}
}

// The same for green contexts: cuGreenCtxCreate, cuGreenCtxStreamCreate
// and cuCtxFromGreenCtx reporting success with a zero handle.
func TestGreenSuccessWithZeroHandleIsAnError(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) < 8 {
		t.Skip("green contexts need a 64-bit platform")
	}
	fk := newCtxFake(t, "13000")
	check := func(name string, err error) {
		t.Helper()
		require.ErrorIs(t, err, ErrorUnknown, name)
		assert.Contains(t, err.Error(), name)
		assert.Contains(t, err.Error(), "reported success but returned")
	}

	d := zeroingDevice(t, fk, func(l *driver) *loader.Proc { return &l.GreenCtxCreate })
	c, err := d.NewGreenContext(8)
	assert.Nil(t, c)
	check("cuGreenCtxCreate", err)

	d = zeroingDevice(t, fk, func(l *driver) *loader.Proc { return &l.GreenCtxStreamCreate })
	c, err = d.NewGreenContext(8)
	require.NoError(t, err)
	s, err := c.Device().NewStream()
	assert.Nil(t, s)
	check("cuGreenCtxStreamCreate", err)
	require.NoError(t, c.Close())

	d = zeroingDevice(t, fk, func(l *driver) *loader.Proc { return &l.CtxFromGreenCtx })
	restore := useDevices(t, []*Device{d})
	defer restore()
	v, err := WrapGreenContext(0x4321)
	assert.Nil(t, v)
	check("cuCtxFromGreenCtx", err)
}
