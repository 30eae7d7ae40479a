package ipc

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cudamem/cudamem/cuda"
)

func TestBadInputNeverPanics(t *testing.T) {
	var d Descriptor
	err := d.UnmarshalBinary([]byte("junk"))
	assert.ErrorIs(t, err, ErrBadDescriptor)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "bad descriptors are invalid arguments too")

	_, err = ImportPool(nil, nil)
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
}
