package resource

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// CloseContext and TrimContext with an ended context leave the
// sub-allocator as it was; with a live one they do what Close and Trim do.
func TestSubAllocatorCloseContext(t *testing.T) {
	a, up, _ := newSA(t, nil)
	b, err := a.Allocate(4096, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	reserved := a.Stats().Reserved
	require.NotZero(t, reserved)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, a.TrimContext(ctx), context.Canceled)
	assert.Equal(t, reserved, a.Stats().Reserved, "nothing given back")
	require.ErrorIs(t, a.CloseContext(ctx), context.Canceled)
	assert.False(t, a.IsClosed(), "still open")
	//lint:ignore SA1012 a nil context is the input under test
	require.ErrorIs(t, a.CloseContext(nil), cuda.ErrInvalidArgument) //nolint:staticcheck

	require.NoError(t, a.TrimContext(context.Background()))
	assert.Zero(t, a.Stats().Reserved, "trimmed")
	require.NoError(t, a.CloseContext(context.Background()))
	assert.True(t, a.IsClosed())
	_, err = a.Allocate(1, nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, _, live := up.counts()
	assert.Zero(t, live)

	var nilSA *SubAllocator
	assert.NoError(t, nilSA.CloseContext(context.Background()))
	assert.ErrorIs(t, nilSA.TrimContext(context.Background()), cuda.ErrInvalidArgument)
}
