//go:build linux

package ipc

import (
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

func TestFDIdentityUUID(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "pool")
	require.NoError(t, err)
	defer f.Close()
	g, err := os.CreateTemp(t.TempDir(), "pool")
	require.NoError(t, err)
	defer g.Close()
	dup, err := syscall.Dup(int(f.Fd()))
	require.NoError(t, err)
	defer syscall.Close(dup)

	a, err := fdIdentity(int(f.Fd()))
	require.NoError(t, err)
	b, err := fdIdentity(dup)
	require.NoError(t, err)
	c, err := fdIdentity(int(g.Fd()))
	require.NoError(t, err)
	assert.Equal(t, a, b, "descriptors of one file: one identity")
	assert.NotEqual(t, a, c, "two files: two identities")
	assert.Equal(t, byte(0x80), a[6]&0xf0, "a version 8 UUID")

	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer null.Close()
	_, err = fdIdentity(int(null.Fd()))
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "a device node names no pool")

	_, err = fdIdentity(-1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	bad := int(r.Fd())
	r.Close()
	w.Close()
	_, err = fdIdentity(bad)
	assert.Error(t, err, "a closed fd")
}

func TestNewForeignHandle(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "pool")
	require.NoError(t, err)
	defer f.Close()
	fd1, err := syscall.Dup(int(f.Fd()))
	require.NoError(t, err)
	fd2, err := syscall.Dup(int(f.Fd()))
	require.NoError(t, err)
	h1, derived, err := NewForeignHandle(fd1)
	require.NoError(t, err)
	defer h1.Close()
	assert.True(t, derived)
	h2, _, err := NewForeignHandle(fd2)
	require.NoError(t, err)
	defer h2.Close()
	assert.Equal(t, h1.UUID(), h2.UUID(), "dedup: one file, one UUID")
	assert.False(t, h1.HasKey())

	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	nfd, err := syscall.Dup(int(null.Fd()))
	require.NoError(t, err)
	null.Close()
	h3, derived, err := NewForeignHandle(nfd)
	require.NoError(t, err)
	defer h3.Close()
	assert.False(t, derived, "no identity: a random UUID")
	assert.NotEqual(t, UUID{}, h3.UUID())

	_, _, err = NewForeignHandle(-1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}
