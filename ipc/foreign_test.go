package ipc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

func TestNewRawDescriptor(t *testing.T) {
	data := exportData(9, 4096)
	u := cuda.NewUUID()
	d, err := NewRawDescriptor(u, data.Reserved[:], 4096)
	require.NoError(t, err)
	assert.Equal(t, u, d.Pool)
	assert.Equal(t, uint64(4096), d.Size)
	assert.Equal(t, data, d.Data)
	assert.False(t, d.IsSealed())
	got := d.ExportData()
	assert.Equal(t, data.Reserved[:], got)
	got[0]++
	assert.Equal(t, data, d.Data, "ExportData returns a copy")

	// It survives the wire format like any descriptor.
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	var back Descriptor
	require.NoError(t, back.UnmarshalBinary(b))
	assert.Equal(t, d, back)

	for name, c := range map[string]struct {
		data []byte
		size uint64
	}{
		"short":     {data.Reserved[:63], 1},
		"long":      {append(data.Reserved[:], 0), 1},
		"nil":       {nil, 1},
		"zero size": {data.Reserved[:], 0},
		"all zeros": {make([]byte, ExportDataSize), 1},
	} {
		_, err := NewRawDescriptor(u, c.data, c.size)
		assert.ErrorIs(t, err, ErrBadDescriptor, name)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
	}
	assert.Equal(t, 64, ExportDataSize)
}

// A keyless pool (a foreign exporter) takes raw descriptors through the
// explicit unauthenticated path only; one without a UUID is taken as the
// pool's own.
func TestImportForeign(t *testing.T) {
	f := newFake()
	p := newImportedPool(nil, cuda.MemPool{}, f, cuda.NewUUID(), poolKey{}, nil)
	data := exportData(4, 1<<20)

	raw, err := NewRawDescriptor(UUID{}, data.Reserved[:], 1<<20)
	require.NoError(t, err)
	_, err = p.Import(raw, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "Import never takes unauthenticated descriptors")
	assert.Zero(t, f.imports)

	b, err := p.ImportForeign(data.Reserved[:], 1<<20, nil)
	require.NoError(t, err)
	b2, err := p.ImportUnauthenticated(raw, nil)
	require.NoError(t, err, "the zero UUID is taken as this pool's")
	assert.Equal(t, b.Ptr(), b2.Ptr())

	other, err := NewRawDescriptor(cuda.NewUUID(), data.Reserved[:], 1<<20)
	require.NoError(t, err)
	_, err = p.ImportUnauthenticated(other, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "another pool's descriptor")

	_, err = p.ImportForeign(data.Reserved[:], 2<<20, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "bounded by the mapping")
	_, err = p.ImportForeign(data.Reserved[:10], 1, nil)
	assert.ErrorIs(t, err, ErrBadDescriptor)

	pool, err := p.PoolErr()
	require.NoError(t, err)
	assert.Equal(t, p.Pool(), pool)
	require.NoError(t, b.Close())
	require.NoError(t, b2.Close())
	require.NoError(t, p.Close())
	_, err = p.PoolErr()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = p.ImportForeign(data.Reserved[:], 1<<20, nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)

	_, err = (*ImportedPool)(nil).ImportForeign(data.Reserved[:], 1, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = (&ImportedPool{}).PoolErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestTorchHandle(t *testing.T) {
	raw := make([]byte, cuda.IPCHandleSize)
	raw[0] = 7
	h, err := NewTorchHandle(raw, 512, 4096)
	require.NoError(t, err)
	assert.Equal(t, byte(7), h.Handle.Reserved[0])
	assert.Equal(t, uint64(512), h.Offset)
	assert.Equal(t, uint64(4096), h.Size)
	_, err = NewTorchHandle(raw[:63], 0, 1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = NewTorchHandle(raw, 0, 0)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)

	// Versioned handles (newer torch): version, 'c', the 64 bytes.
	for _, v := range []byte{2, 3} {
		vh, err := NewTorchHandle(append([]byte{v, 'c'}, raw...), 8, 16)
		require.NoError(t, err, "version %d", v)
		assert.Equal(t, h.Handle, vh.Handle, "version %d: the same cudaIpcMemHandle_t", v)
	}
	_, err = NewTorchHandle(append([]byte{4, 'c'}, raw...), 0, 1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "unknown version")
	_, err = NewTorchHandle(append([]byte{2, 'c'}, raw[:60]...), 0, 1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "short")
	_, err = NewTorchHandle(append([]byte{2, 'e'}, make([]byte, 40)...), 0, 1)
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "expandable segments")
	_, err = NewTorchHandle(append([]byte{2, 'x'}, raw...), 0, 1)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "unknown type")

	_, err = OpenTorch(nil, h)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = OpenTorch(&cuda.Device{}, TorchHandle{Offset: ^uint64(0), Size: 2})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "offset+size wraps")
	_, err = ExportTorch(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)

	var m *torchMapping
	assert.ErrorIs(t, m.Deallocate(1, 1, nil), cuda.ErrInvalidArgument)
	assert.Equal(t, -1, m.DeviceID())
	_, _, err = m.AllocatePtr(1, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}
