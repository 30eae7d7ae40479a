package ipc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// A keyless pool (a foreign exporter) takes a buffer's raw parts through
// the explicit unauthenticated path only, and refuses parts that cannot be
// an export (wrong length, all zeros, size 0) before the driver sees them.
func TestImportUnauthenticated(t *testing.T) {
	f := newFake()
	p := newImportedPool(nil, cuda.MemPool{}, f, cuda.NewUUID(), poolKey{}, nil)
	data := exportData(4, 1<<20)

	for name, c := range map[string]struct {
		data []byte
		size uint64
	}{
		"short":     {data.Reserved[:63], 1},
		"long":      {append(data.Reserved[:], 0), 1},
		"nil":       {nil, 1},
		"zero size": {data.Reserved[:], 0},
		"all zeros": {make([]byte, 64), 1},
	} {
		_, err := p.ImportUnauthenticated(c.data, c.size, nil)
		assert.ErrorIs(t, err, ErrBadDescriptor, name)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
	}
	assert.Zero(t, f.driverCalls(), "refused before the driver")

	raw := Descriptor{Size: 1 << 20, Data: data}
	_, err := p.Import(raw, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "Import never takes unauthenticated descriptors")
	assert.Zero(t, f.imports)

	b, err := p.ImportUnauthenticated(data.Reserved[:], 1<<20, nil)
	require.NoError(t, err)
	re, err := ExportBuffer(b)
	require.NoError(t, err)
	assert.Equal(t, p.UUID(), re.Pool, "taken as this pool's")
	b2, err := p.ImportUnauthenticated(raw.ExportData(), raw.Size, nil)
	require.NoError(t, err)
	assert.Equal(t, b.Ptr(), b2.Ptr())
	got := raw.ExportData()
	got[0]++
	assert.Equal(t, data, raw.Data, "ExportData returns a copy")

	_, err = p.ImportUnauthenticated(data.Reserved[:], 2<<20, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "bounded by the mapping")

	pool, err := p.PoolErr()
	require.NoError(t, err)
	assert.Equal(t, p.Pool(), pool)
	require.NoError(t, b.Close())
	require.NoError(t, b2.Close())
	require.NoError(t, p.Close())
	_, err = p.PoolErr()
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = p.ImportUnauthenticated(data.Reserved[:], 1<<20, nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)

	_, err = (*ImportedPool)(nil).ImportUnauthenticated(data.Reserved[:], 1, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = (&ImportedPool{}).PoolErr()
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

func TestLegacyHandle(t *testing.T) {
	raw := make([]byte, cuda.IPCHandleSize)
	raw[0] = 7
	h, err := NewTorchShare(raw, 512, 4096, nil, 0, nil, false)
	require.NoError(t, err)
	assert.Equal(t, byte(7), h.Handle.Reserved[0])
	assert.Equal(t, uint64(512), h.Offset)
	assert.Equal(t, uint64(4096), h.Size)
	_, err = NewTorchShare(raw[:63], 0, 1, nil, 0, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = NewTorchShare(raw, 0, 0, nil, 0, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = NewTorchShare(raw, 0, 1, nil, 5, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "a counter index without a counter file")
	assert.Empty(t, h.RefCounter, "no counter file: no counter")

	// Versioned handles (newer torch): version, 'c', the 64 bytes.
	for _, v := range []byte{2, 3} {
		vh, err := NewTorchShare(append([]byte{v, 'c'}, raw...), 8, 16, nil, 0, nil, false)
		require.NoError(t, err, "version %d", v)
		assert.Equal(t, h.Handle, vh.Handle, "version %d: the same cudaIpcMemHandle_t", v)
	}
	_, err = NewTorchShare(append([]byte{4, 'c'}, raw...), 0, 1, nil, 0, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "unknown version")
	_, err = NewTorchShare(append([]byte{2, 'c'}, raw[:60]...), 0, 1, nil, 0, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "short")
	_, err = NewTorchShare(append([]byte{2, 'e'}, make([]byte, 40)...), 0, 1, nil, 0, nil, false)
	assert.ErrorIs(t, err, cuda.ErrNotSupported, "expandable segments")
	_, err = NewTorchShare(append([]byte{2, 'x'}, raw...), 0, 1, nil, 0, nil, false)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "unknown type")

	_, err = OpenLegacy(nil, h)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	_, err = OpenLegacy(&cuda.Device{}, LegacyHandle{Offset: ^uint64(0), Size: 2})
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "offset+size wraps")
	_, err = ExportLegacy(nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)

	var m *legacyMapping
	assert.ErrorIs(t, m.Deallocate(1, 1, nil), cuda.ErrInvalidArgument)
	assert.Equal(t, -1, m.DeviceID())
	_, _, err = m.AllocatePtr(1, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}
