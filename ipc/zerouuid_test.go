//go:build linux

package ipc

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// The zero UUID names no pool: imports are deduplicated by UUID, so two
// pools both under it would be taken for one (found in review). NewHandle
// refuses it (the fd stays the caller's), and so does ReceiveHandle (the
// fd that came with the message is closed).
func TestZeroUUIDRefused(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	fd, err := dup(int(w.Fd()))
	require.NoError(t, err)
	_, err = NewHandle(fd, UUID{}.String())
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "zero UUID")

	a, b := socketPair(t)
	before := testutil.FDs(t)
	require.NoError(t, SendFDs(a, encodeHandle(UUID{}, poolKey{}), fd))
	_, err = ReceiveHandle(context.Background(), b)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Equal(t, before, testutil.FDs(t), "the received fd is closed")
	require.NoError(t, syscall.Close(fd))
}
