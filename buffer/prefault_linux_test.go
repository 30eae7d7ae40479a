package buffer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/internal/staging"
)

func mappedOrUnknown(b []byte) bool { return mapped(b) }

// Fresh anonymous pages are unmapped until prefault maps them; their
// contents stay zero.
func TestPrefaultMapsFreshPages(t *testing.T) {
	for _, mode := range []staging.Prefault{staging.PrefaultTouch, staging.PrefaultPopulate} {
		m, err := unix.Mmap(-1, 0, 64*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		require.NoError(t, err)
		t.Cleanup(func() { _ = unix.Munmap(m) })
		assert.False(t, mapped(m), "%v: fresh pages are not mapped", mode)
		prefault(m[100:len(m)-100], mode)
		assert.True(t, mapped(m), "%v: prefault maps every page it covers, the partial ones too", mode)
		for i, v := range m {
			if v != 0 {
				t.Fatalf("%v: byte %d is %d after prefault", mode, i, v)
			}
		}
	}
}

func TestPrefaultOffLeavesPagesUnmapped(t *testing.T) {
	m, err := unix.Mmap(-1, 0, 8*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	prefault(m, staging.PrefaultOff)
	assert.False(t, mapped(m))
}
