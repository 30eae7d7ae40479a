package buffer

import (
	"runtime"
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

// fresh tells a new mapping from a written one by its first and last
// whole pages; a part of a page is never enough to tell.
func TestFreshDestination(t *testing.T) {
	m, err := unix.Mmap(-1, 0, 16*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	assert.True(t, fresh(m), "a new mapping")
	assert.False(t, fresh(m[1:pageSize]), "no whole page")
	m[0] = 1
	assert.True(t, fresh(m), "its last page still unmapped")
	m[len(m)-1] = 1
	assert.False(t, fresh(m), "first and last pages written")
	assert.True(t, fresh(m[pageSize:len(m)-pageSize]), "the middle is still fresh")
	require.NoError(t, unix.Madvise(m, unix.MADV_DONTNEED))
	assert.True(t, fresh(m), "pages given back")
}

// A copy out into fresh pages runs stageFreshWorkers workers; into
// mapped memory, stageOutWorkers. Both land the bytes.
func TestStagingFreshWorkers(t *testing.T) {
	defer func(o, f int) { stageOutWorkers, stageFreshWorkers = o, f }(stageOutWorkers, stageFreshWorkers)
	defer staging.Profile.Store(staging.Profile.Load())
	staging.Profile.Store(true)
	stageOutWorkers, stageFreshWorkers = 2, 3
	const n = 8 * 64 << 10
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	for _, c := range []struct {
		name    string
		workers int
	}{{"fresh", 3}, {"mapped", 2}} {
		p := fakePool(64<<10, 2)
		fe := newFakeEngine(t, n, int64(n))
		copy(fe.dev, pattern(n, 9))
		before := staging.Read()
		done, err := stagedDtoH(p, fe, nil, m, fakeBase)
		require.True(t, done, c.name)
		require.NoError(t, err, c.name)
		require.Equal(t, pattern(n, 9), m, c.name)
		assert.Equal(t, int64(min(c.workers, runtime.GOMAXPROCS(0))), staging.Read().Sub(before).Workers, c.name)
	}
}

// Copies out of a device into fresh memory are staged from
// stageFreshMinBytes, into mapped memory from stageOutMinBytes; into a
// device, from stageMinBytes whatever the slice.
func TestStageableFreshThreshold(t *testing.T) {
	const n = 1 << 20
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	require.Less(t, n, defaultStageOutMinBytes)
	require.Greater(t, n, defaultStageFreshMinBytes)
	assert.True(t, stageable(false, n, m), "1 MiB out into fresh pages")
	assert.False(t, stageable(false, defaultStageFreshMinBytes-1, m[:defaultStageFreshMinBytes-1]), "below the fresh threshold")
	assert.False(t, stageable(true, n, m), "into a device: stageMinBytes alone")
	for i := range m {
		m[i] = 1
	}
	assert.False(t, stageable(false, n, m), "1 MiB out into mapped pages")
	assert.True(t, stageable(false, defaultStageOutMinBytes, make([]byte, 0)), "from stageOutMinBytes, any destination")
}
