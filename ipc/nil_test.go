package ipc

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

func TestBadInputNeverPanics(t *testing.T) {
	var d Descriptor
	err := d.UnmarshalBinary([]byte("junk"))
	assert.ErrorIs(t, err, ErrBadDescriptor)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "bad descriptors are invalid arguments too")

	_, err = ImportPool(nil, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = ImportPool(nil, &Handle{})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	var h *Handle
	_, err = h.FD()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.NoError(t, h.Close())
	var p *ImportedPool
	_, err = p.Allocate(1, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = p.Import(Descriptor{}, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = ExportPool(p)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = ExportPool(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, -1, p.DeviceID())
	assert.True(t, p.IsClosed())
	assert.NoError(t, p.Close())
	_, err = ExportBuffer(nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = ExportLegacy(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = OpenLegacy(nil, LegacyHandle{})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = NewHandle(-1, UUID{}.String())
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// TestNilAndZeroReceivers calls every exported method of every exported
// type of the package on a nil pointer and on a zero value, with zero
// arguments: none may panic, every error must match cuda.ErrInvalidArgument
// or cuda.ErrClosed, and no descriptor may be opened or closed (a zero
// Handle or ImportedPool once closed fd 0 on Close).
func TestNilAndZeroReceivers(t *testing.T) {
	if runtime.GOOS == "linux" {
		ensureStdinOpen(t)
	}
	before := testutil.OpenFDs()
	values := []any{
		(*Handle)(nil), &Handle{},
		(*ImportedPool)(nil), &ImportedPool{},
		(*Descriptor)(nil), &Descriptor{}, Descriptor{},
		(*LegacyHandle)(nil), &LegacyHandle{}, LegacyHandle{},
		UUID{}, &UUID{},
	}
	calls := 0
	for _, v := range values {
		rv := reflect.ValueOf(v)
		rt := rv.Type()
		for i := range rt.NumMethod() {
			m := rt.Method(i)
			name := fmt.Sprintf("(%s).%s", describe(rv), m.Name)
			args := []reflect.Value{rv}
			for j := 1; j < m.Type.NumIn(); j++ {
				args = append(args, reflect.Zero(m.Type.In(j)))
			}
			if rt.Kind() == reflect.Pointer && rv.IsNil() && rt.Elem().Kind() != reflect.Struct {
				continue // a nil *UUID: methods of the array type deref it, as for any Go value method
			}
			if rt.Kind() == reflect.Pointer && rv.IsNil() && !hasPointerReceiver(rt.Elem(), m.Name) {
				continue // promoted value method on a nil pointer: Go itself panics before our code runs
			}
			calls++
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("%s panicked: %v", name, r)
					}
				}()
				for _, out := range m.Func.Call(args) {
					err, ok := out.Interface().(error)
					if !ok || err == nil {
						continue
					}
					if !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) {
						t.Errorf("%s: error %q matches neither ErrInvalidArgument nor ErrClosed", name, err)
					}
				}
			}()
		}
	}
	assert.Greater(t, calls, 30, "the sweep reached the methods")
	testutil.AssertNoNewFDs(t, before, "no descriptor opened")
	if runtime.GOOS == "linux" {
		assert.True(t, fdOpen(0), "fd 0 is still open")
	}
}

func describe(v reflect.Value) string {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return "nil " + v.Type().String()
	}
	return "zero " + v.Type().String()
}

// hasPointerReceiver reports whether method name is declared on *T, not T.
func hasPointerReceiver(t reflect.Type, name string) bool {
	_, onValue := t.MethodByName(name)
	return !onValue
}

func fdOpen(fd int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/self/fd/%d", fd))
	return err == nil
}

// ensureStdinOpen makes fd 0 an open descriptor if it is not, so closing
// it by mistake is observable.
func ensureStdinOpen(t *testing.T) {
	t.Helper()
	if fdOpen(0) {
		return
	}
	f, err := os.Open(os.DevNull)
	require.NoError(t, err)
	require.NoError(t, dup2(int(f.Fd()), 0))
	require.NoError(t, f.Close())
}
