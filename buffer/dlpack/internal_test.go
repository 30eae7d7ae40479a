//go:build linux && (amd64 || arm64)

package dlpack

import (
	"bufio"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// unmappedPage returns the address of a page that was mapped and is not
// any more: reading it must fail, never crash.
func unmappedPage(t *testing.T) uintptr {
	b, err := syscall.Mmap(-1, 0, 2*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	p := uintptr(unsafe.Pointer(&b[0]))
	require.NoError(t, syscall.Munmap(b))
	return p
}

func TestReadMem(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		forcePipe = pipe
		src := make([]byte, 10000)
		for i := range src {
			src[i] = byte(i * 7)
		}
		dst := make([]byte, len(src))
		require.NoError(t, readMem(dst, uintptr(unsafe.Pointer(&src[0]))))
		assert.Equal(t, src, dst, "pipe %v", pipe)
		assert.NoError(t, readMem(nil, 0), "nothing to read")

		gone := unmappedPage(t)
		assert.ErrorIs(t, readMem(make([]byte, 8), gone), syscall.EFAULT, "pipe %v", pipe)
		assert.Error(t, readMem(make([]byte, 8), 0))
		assert.Error(t, readMem(make([]byte, 8), ^uintptr(3)), "wraps")

		// A range that starts mapped and runs into the unmapped page.
		b, err := syscall.Mmap(-1, 0, 2*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		require.NoError(t, err)
		base := uintptr(unsafe.Pointer(&b[0]))
		_, _, errno := syscall.Syscall(syscall.SYS_MUNMAP, base+4096, 4096, 0)
		require.Zero(t, errno)
		assert.NoError(t, readMem(make([]byte, 16), base+4096-16))
		assert.ErrorIs(t, readMem(make([]byte, 32), base+4096-16), syscall.EFAULT, "pipe %v", pipe)
		_, _, errno = syscall.Syscall(syscall.SYS_MUNMAP, base, 4096, 0)
		require.Zero(t, errno)
	}
	forcePipe = false
}

// TestReadablePages probes ranges across several writev batches: the
// first unreadable page is reported, at its address, wherever it falls.
func TestReadablePages(t *testing.T) {
	page := syscall.Getpagesize()
	const pages = 2*probeBatch + 10
	mem, err := syscall.Mmap(-1, 0, pages*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	defer syscall.Munmap(mem)
	base := uintptr(unsafe.Pointer(&mem[0]))
	require.NoError(t, readablePages(base, uintptr(pages*page)), "untouched anonymous pages read as zeros")
	require.NoError(t, readablePages(base+7, 1), "one byte")
	require.NoError(t, readablePages(base+uintptr(page)-1, 2), "two bytes across a page boundary")
	require.NoError(t, readablePages(base, 0))

	for _, bad := range []int{0, 1, probeBatch - 1, probeBatch, probeBatch + 1, 2 * probeBatch, pages - 1} {
		at := base + uintptr(bad*page)
		_, _, e := syscall.Syscall(syscall.SYS_MPROTECT, at, uintptr(page), syscall.PROT_NONE)
		require.Zero(t, e)
		err := readablePages(base, uintptr(pages*page))
		var pe *pageError
		require.ErrorAs(t, err, &pe, "PROT_NONE page %d", bad)
		assert.Equal(t, at, pe.addr, "page %d", bad)
		assert.ErrorIs(t, err, syscall.EFAULT)
		require.NoError(t, readablePages(base, uintptr(bad*page)), "the pages before page %d", bad)
		if bad+1 < pages {
			require.NoError(t, readablePages(at+uintptr(page), uintptr((pages-bad-1)*page)), "the pages after page %d", bad)
		}
		_, _, e = syscall.Syscall(syscall.SYS_MPROTECT, at, uintptr(page), syscall.PROT_READ|syscall.PROT_WRITE)
		require.Zero(t, e)
	}
	assert.Error(t, readablePages(unmappedPage(t), 1))
	assert.Error(t, readablePages(^uintptr(0)-10, 100), "wraps")
	assert.Error(t, readablePages(^uintptr(0)-10, 5), "the top of the address space is not user memory")
}

// TestCoverRange reads synthetic maps files.
func TestCoverRange(t *testing.T) {
	const maps = `00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/dbus-daemon
00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/dbus-daemon
00655000-00656000 ---p 00000000 00:00 0
00656000-00660000 rw-p 00000000 00:00 0                                  [heap]
00700000-00800000 rw-s 00000000 00:05 42      /a/path with spaces
7ffd0000-7ffe0000 rw-p 00000000 00:00 0 ` + "\n"
	cover := func(addr, n uintptr, need perm) error {
		return coverRange(bufio.NewReader(strings.NewReader(maps)), addr, n, need)
	}
	assert.NoError(t, cover(0x400000, 0x52000, permRead|permExec), "one whole mapping")
	assert.NoError(t, cover(0x652000, 0x3000, permRead|permWrite))
	assert.NoError(t, cover(0x700100, 0x100, permWrite), "a shared mapping")
	assert.NoError(t, cover(0x651000, 0x4000, permRead), "adjacent mappings")
	assert.NoError(t, cover(0x7ffdffff, 1, permRead), "the last line, without a newline")

	var me *mapError
	err := cover(0x651000, 0x4000, permRead|permWrite)
	require.ErrorAs(t, err, &me)
	assert.Equal(t, mapError{addr: 0x651000, lo: 0x651000, hi: 0x652000, perms: "r--p", missing: permWrite}, *me)
	err = cover(0x654000, 0x3000, permRead)
	require.ErrorAs(t, err, &me)
	assert.Equal(t, uintptr(0x655000), me.addr, "the guard page")
	assert.Equal(t, permRead, me.missing)
	assert.ErrorContains(t, err, "---p")
	err = cover(0x65f000, 0x2000, permRead)
	require.ErrorAs(t, err, &me)
	assert.Equal(t, mapError{addr: 0x660000}, *me, "a gap after the heap")
	assert.ErrorContains(t, err, "nothing is mapped at 0x660000")
	err = cover(0x100000, 1, permRead)
	require.ErrorAs(t, err, &me)
	assert.Equal(t, uintptr(0x100000), me.addr, "below every mapping")
	err = cover(0x7ffe0000, 1, permRead)
	require.ErrorAs(t, err, &me)
	assert.Equal(t, uintptr(0x7ffe0000), me.addr, "past every mapping")
	assert.ErrorContains(t, cover(0x400000, 1, permWrite), "without write permission")
	assert.ErrorContains(t, cover(0x652000, 1, permExec), "without execute permission")

	bad := coverRange(bufio.NewReader(strings.NewReader("garbage\n")), 0x1000, 1, permRead)
	assert.ErrorIs(t, bad, errNoMaps)
	bad = coverRange(bufio.NewReader(strings.NewReader("2000-1000 rw-p 0 0:0 0\n")), 0x1000, 1, permRead)
	assert.ErrorIs(t, bad, errNoMaps, "bounds the wrong way round")

	// A line longer than the reader's buffer is skipped past its fields.
	long := "00001000-00002000 r--p 0 0:0 0 /" + strings.Repeat("x", 100) + "\n00002000-00003000 rw-p 0 0:0 0\n"
	assert.NoError(t, coverRange(bufio.NewReaderSize(strings.NewReader(long), 32), 0x1800, 0x1000, permRead))
}

// TestCheckHostWithoutMaps: where /proc/self/maps cannot be read, the page
// probe still refuses unreadable pages, and writability, unknown, needs
// AllowReadOnly.
func TestCheckHostWithoutMaps(t *testing.T) {
	old := mapsPath
	mapsPath = "/nonexistent/maps"
	defer func() { mapsPath = old }()
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	defer syscall.Munmap(mem)
	base := uintptr(unsafe.Pointer(&mem[0]))

	err = checkHost("op", 0x1000, base, uint64(3*page), false)
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "writability unknown")
	assert.ErrorContains(t, err, "AllowReadOnly")
	assert.NoError(t, checkHost("op", 0x1000, base, uint64(3*page), true))

	_, _, e := syscall.Syscall(syscall.SYS_MPROTECT, base+uintptr(page), uintptr(page), syscall.PROT_NONE)
	require.Zero(t, e)
	err = checkHost("op", 0x1000, base, uint64(3*page), true)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "the probe finds the guard page")
	assert.ErrorContains(t, err, "cannot be read")

	// The deleter: readable is all that can be checked.
	_, err = deleterProc("op", 0x1000, base)
	assert.NoError(t, err)
	_, err = deleterProc("op", 0x1000, base+uintptr(page))
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}
