//go:build linux

package ipc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/cuda"
)

// inheritedFD returns a descriptor without close-on-exec, as one this
// process inherited from its parent arrives (/dev/null: a kind a pool
// export may be).
func inheritedFD(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY, 0)
	require.NoError(t, err)
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0)
	require.NoError(t, err)
	require.False(t, closeOnExec(t, fd))
	return fd
}

func closeOnExec(t *testing.T, fd int) bool {
	t.Helper()
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err)
	return flags&unix.FD_CLOEXEC != 0
}

// fileID names the open file fd refers to, to recognize it in a child.
func fileID(t *testing.T, fd int) string {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(fd, &st))
	return fmt.Sprintf("%d:%d:%d", st.Dev, st.Ino, st.Rdev)
}

const envInheritCheck = "CUDAMEM_TEST_IPC_NOT_INHERITED" // fd=id pairs, not secrets

// TestHandleFDsAreCloseOnExec: every fd a Handle owns is close-on-exec,
// whatever it was made from: an inherited fd given to NewHandle or
// NewHandle (which arrives without the flag), one received by
// ReceiveHandle, a re-exported pool's duplicate, and the duplicate an
// imported pool keeps. Before, NewHandle and NewHandle took the
// fd as it was, so the pool's fd passed to every child the process
// started, and to theirs. A child started without ExtraFiles must not
// have any of them open.
func TestHandleFDsAreCloseOnExec(t *testing.T) {
	if spec := os.Getenv(envInheritCheck); spec != "" {
		for _, pair := range strings.Split(spec, ",") {
			fdStr, id, _ := strings.Cut(pair, "=")
			fd, err := strconv.Atoi(fdStr)
			require.NoError(t, err)
			var st syscall.Stat_t
			if syscall.Fstat(fd, &st) == nil {
				assert.NotEqual(t, id, fmt.Sprintf("%d:%d:%d", st.Dev, st.Ino, st.Rdev), "fd %d was inherited", fd)
			}
		}
		return
	}
	installFakeImports(t)
	h1, err := NewHandle(inheritedFD(t), cuda.NewUUID().String())
	require.NoError(t, err)
	defer h1.Close()
	h2, err := NewHandle(inheritedFD(t), cuda.NewUUID().String()+"."+strings.Repeat("ab", keySize))
	require.NoError(t, err)
	defer h2.Close()

	a, b := socketPair(t)
	require.NoError(t, SendHandle(a, h2))
	h3, err := ReceiveHandle(context.Background(), b)
	require.NoError(t, err)
	defer h3.Close()

	p, err := ImportPool(&cuda.Device{}, h1)
	require.NoError(t, err)
	defer p.Close()
	h4, err := ExportPool(p)
	require.NoError(t, err)
	defer h4.Close()

	var spec []string
	for name, h := range map[string]*Handle{"NewHandle": h1, "NewHandle of a token": h2, "ReceiveHandle": h3, "ipc.ExportPool": h4} {
		fd, err := h.FD()
		require.NoError(t, err)
		assert.True(t, closeOnExec(t, fd), "%s: the Handle's fd is close-on-exec", name)
		spec = append(spec, fmt.Sprintf("%d=%s", fd, fileID(t, fd)))
	}
	kept, err := p.file.Int()
	require.NoError(t, err)
	assert.True(t, closeOnExec(t, kept), "the imported pool's kept duplicate")

	// A refused token takes nothing, and changes nothing either.
	fd := inheritedFD(t)
	_, err = NewHandle(fd, "not a token")
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.False(t, closeOnExec(t, fd), "a refused fd is left as it was")
	require.NoError(t, syscall.Close(fd))

	cmd := exec.Command(os.Args[0], "-test.run", "^TestHandleFDsAreCloseOnExec$")
	cmd.Env = append(os.Environ(), envInheritCheck+"="+strings.Join(spec, ","))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child saw an inherited pool fd:\n%s", out)
}
