//go:build linux && (amd64 || arm64)

package loader

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A nil or zero Library used to reach dlsym with handle 0, which glibc
// reads as RTLD_DEFAULT: a lookup in every loaded library. A closed one did
// the same. Each is refused now.
func TestNilZeroAndClosedLibrary(t *testing.T) {
	var nilLib *Library
	assert.Equal(t, "", nilLib.Path())
	assert.NoError(t, nilLib.Close())
	_, err := nilLib.Lookup("strlen")
	assert.ErrorIs(t, err, ErrInvalidArgument)

	zero := &Library{}
	p, err := zero.Lookup("strlen")
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.False(t, p.Found(), "a zero Library must not find libc's strlen")
	assert.NoError(t, zero.Close())
	assert.NoError(t, zero.Close())

	l := libc(t)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close is idempotent")
	p, err = l.Lookup("strlen")
	assert.ErrorIs(t, err, ErrClosed)
	assert.False(t, p.Found())

	_, err = OpenLibrary("")
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

func TestNilProcDriverAndErrors(t *testing.T) {
	var p *Proc
	assert.Equal(t, "", p.Name())
	assert.False(t, p.Found())
	assert.Zero(t, p.Addr())
	var d *Driver
	missing, err := d.Resolve(&struct{ DeviceGet Proc }{})
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Nil(t, missing)
	var le *LoadError
	var ie *InitError
	assert.Equal(t, "<nil>", le.Error())
	assert.Equal(t, "<nil>", ie.Error())
	assert.False(t, errors.Is(ErrInvalidArgument, ErrClosed))
}
