package ipc

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// TestAlteredDescriptorIsBadDescriptor: a descriptor altered in any field
// is refused by Import with an error wrapping ErrBadDescriptor (as Import
// documents), and never reaches the driver. Before, one with another
// pool's UUID (or size 0) was refused with plain cuda.ErrInvalidArgument.
// Every field is altered in the struct, and every byte on the wire (with
// the checksum made valid again, as a peer that knows the format would).
func TestAlteredDescriptorIsBadDescriptor(t *testing.T) {
	p, f := fakePool(t)
	defer p.Close()
	genuine := desc(p, 1, 1<<20, 1<<20)
	alter := map[string]func(d *Descriptor){
		"pool: one bit":          func(d *Descriptor) { d.Pool[0] ^= 1 },
		"pool: last byte":        func(d *Descriptor) { d.Pool[15] ^= 0x80 },
		"pool: another UUID":     func(d *Descriptor) { d.Pool = cuda.NewUUID() },
		"pool: zero":             func(d *Descriptor) { d.Pool = UUID{} },
		"size: 0":                func(d *Descriptor) { d.Size = 0 },
		"size: one less":         func(d *Descriptor) { d.Size-- },
		"size: one more":         func(d *Descriptor) { d.Size++ },
		"size: 2^64-1":           func(d *Descriptor) { d.Size = math.MaxUint64 },
		"export data: zero":      func(d *Descriptor) { d.Data = cuda.MemPoolPtrExportData{} },
		"MAC: zero":              func(d *Descriptor) { d.MAC = [MACSize]byte{} },
		"MAC: another key's":     func(d *Descriptor) { *d = newPoolKey().seal(*d) },
		"pool and MAC resealed":  func(d *Descriptor) { d.Pool = cuda.NewUUID(); *d = newPoolKey().seal(*d) },
		"pool, size, data, MAC":  func(d *Descriptor) { *d = Descriptor{Pool: cuda.NewUUID(), Size: 1, MAC: [MACSize]byte{1}} },
		"everything but the MAC": func(d *Descriptor) { *d = Descriptor{MAC: d.MAC} },
	}
	for i := range len(genuine.Data.Reserved) {
		alter[fmt.Sprintf("export data: byte %d", i)] = func(d *Descriptor) { d.Data.Reserved[i] ^= 0x10 }
	}
	for i := range MACSize {
		alter[fmt.Sprintf("MAC: byte %d", i)] = func(d *Descriptor) { d.MAC[i] ^= 0x01 }
	}
	for name, m := range alter {
		d := genuine
		m(&d)
		calls := f.driverCalls()
		b, err := p.Import(d, nil)
		assert.Nil(t, b, name)
		if assert.ErrorIs(t, err, ErrBadDescriptor, name) {
			assert.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
			assert.Contains(t, err.Error(), "ImportedPool.Import", name)
		}
		assert.Equal(t, calls, f.driverCalls(), "%s: refused before the driver", name)
	}

	// On the wire: flip each byte of the encoding; whatever decoding lets
	// through (the checksum is fixed up, so everything but the header
	// checks does) Import refuses as a bad descriptor.
	enc, err := genuine.MarshalBinary()
	require.NoError(t, err)
	for i := range DescriptorSize {
		for _, fixCRC := range []bool{false, true} {
			b := append([]byte(nil), enc...)
			b[i] ^= 0x04
			if fixCRC && i < descriptorCRC {
				binary.LittleEndian.PutUint32(b[descriptorCRC:], checksum(b[:descriptorCRC]))
			}
			var d Descriptor
			if err := d.UnmarshalBinary(b); err != nil {
				assert.ErrorIs(t, err, ErrBadDescriptor, "byte %d: decoding", i)
				continue
			}
			_, err := p.Import(d, nil)
			assert.ErrorIs(t, err, ErrBadDescriptor, "byte %d (checksum fixed %v): Import", i, fixCRC)
		}
	}

	// The pool's own checks on a descriptor the key did seal: a lying size
	// from a holder of the key is a bad descriptor too.
	_, err = p.Import(desc(p, 2, 4096, 8192), nil)
	assert.ErrorIs(t, err, ErrBadDescriptor, "a sealed size past the mapping")

	b, err := p.Import(genuine, nil)
	require.NoError(t, err, "the genuine descriptor still imports")
	require.NoError(t, b.Close())
}

// TestAlteredDescriptorUnauthenticated: the unauthenticated path has no
// MAC to check, but what it does check (the size) is refused
// as ErrBadDescriptor too, and so is every descriptor given to Import of
// a pool without a key.
func TestAlteredDescriptorUnauthenticated(t *testing.T) {
	f := newFake()
	p := newImportedPool(nil, cuda.MemPool{}, f, cuda.NewUUID(), poolKey{}, nil)
	defer p.Close()
	d := Descriptor{Pool: p.UUID(), Size: 4096, Data: exportData(5, 4096)}
	cases := map[string]Descriptor{
		"size 0":              {Pool: p.UUID(), Data: d.Data},
		"size past the range": {Pool: p.UUID(), Size: 8192, Data: d.Data},
	}
	for name, bad := range cases {
		_, err := p.ImportUnauthenticated(bad.ExportData(), bad.Size, nil)
		assert.ErrorIs(t, err, ErrBadDescriptor, name)
		assert.Contains(t, err.Error(), "ImportedPool.ImportUnauthenticated", name)
	}
	_, err := p.Import(d, nil)
	assert.ErrorIs(t, err, ErrBadDescriptor, "a keyless pool's Import authenticates nothing")
	assert.Contains(t, err.Error(), "has no pool key")
}

// TestClosedEntryPoints: every export, import and re-export entry point
// answers cuda.ErrClosed for a closed imported pool, a closed Buffer and
// a closed Handle, whatever its other arguments, and calls no driver.
// Before, ExportBuffer of a Buffer of a closed ImportedPool (the Buffer
// still open, as Buffers outlive their pool's Close) made a descriptor.
// (Closed DevicePools and PinnedPools are covered against the fake
// driver in internal/suites/probe: TestIPCClosedEntryPoints.)
func TestClosedEntryPoints(t *testing.T) {
	keyed, kf := fakePool(t)
	live, err := keyed.Import(desc(keyed, 1, 1<<20, 1<<20), nil) // outlives the pool's Close
	require.NoError(t, err)
	gone, err := keyed.Import(desc(keyed, 2, 4096, 4096), nil)
	require.NoError(t, err)
	require.NoError(t, gone.Close())
	keyless := newImportedPool(nil, cuda.MemPool{}, newFake(), cuda.NewUUID(), poolKey{}, nil)
	liveKeyless, err := keyless.ImportUnauthenticated(rawData(9, 4096), 4096, nil)
	require.NoError(t, err)
	var fileBacked *ImportedPool
	if runtime.GOOS != "windows" {
		fileBacked = newImportedPool(nil, cuda.MemPool{}, newFake(), cuda.NewUUID(), newPoolKey(), keptFile(t))
		require.NoError(t, fileBacked.Close())
	}
	fabricBacked := newImportedPool(nil, cuda.MemPool{}, newFake(), cuda.NewUUID(), newPoolKey(), nil)
	fabricBacked.fabric = sealFabric(cuda.MemFabricHandle{Data: [64]byte{7}})
	require.NoError(t, fabricBacked.Close())
	require.NoError(t, keyed.Close())
	require.NoError(t, keyless.Close())
	require.True(t, keyed.IsClosed())

	var closedHandle *Handle
	if runtime.GOOS != "windows" {
		closedHandle, err = NewHandle(pipeReadEnd(t), cuda.NewUUID().String())
		require.NoError(t, err)
		closedHandle.key = newPoolKey()
		require.NoError(t, closedHandle.Close())
	}

	calls := kf.driverCalls()
	good := desc(keyed, 1, 1<<20, 1<<20)
	entries := map[string]func() error{
		"ExportBuffer(buffer of a closed pool)":         func() error { _, err := ExportBuffer(live); return err },
		"ExportBuffer(buffer of a closed keyless pool)": func() error { _, err := ExportBuffer(liveKeyless); return err },
		"ExportBuffer(closed buffer)":                   func() error { _, err := ExportBuffer(gone); return err },
		"ExportLegacy(closed buffer)":                   func() error { _, err := ExportLegacy(gone); return err },
		"ImportedPool.Import(genuine)":                  func() error { _, err := keyed.Import(good, nil); return err },
		"ImportedPool.Import(altered)":                  func() error { _, err := keyed.Import(Descriptor{Pool: cuda.NewUUID()}, nil); return err },
		"ImportedPool.ImportUnauthenticated(keyed)":     func() error { _, err := keyed.ImportUnauthenticated(good.ExportData(), good.Size, nil); return err },
		"ImportedPool.ImportUnauthenticated(keyless)": func() error {
			_, err := keyless.ImportUnauthenticated(rawData(9, 4096), 4096, nil)
			return err
		},
		"ExportPoolFabric(fd-backed imported)":  func() error { _, err := ExportPoolFabric(keyed); return err },
		"ExportPool(closed imported pool)":      func() error { _, err := ExportPool(keyed); return err },
		"ExportPoolFabric(closed imported)":     func() error { _, err := ExportPoolFabric(fabricBacked); return err },
		"ImportedPool.Allocate":                 func() error { _, err := keyed.Allocate(1, nil); return err },
		"ImportedPool.PoolErr":                  func() error { _, err := keyed.PoolErr(); return err },
		"ExportPool(closed fd-backed imported)": func() error { _, err := ExportPool(fileBacked); return err },
	}
	if closedHandle != nil {
		entries["ImportPool(closed handle)"] = func() error { _, err := ImportPool(&cuda.Device{}, closedHandle); return err }
		entries["SendHandle(closed handle)"] = func() error { return SendHandle(nil, closedHandle) } // the Handle is looked at first
		entries["Handle.ExtraFile(closed)"] = func() error { _, err := closedHandle.ExtraFile(); return err }
		entries["Handle.FD(closed)"] = func() error { _, err := closedHandle.FD(); return err }
	} else {
		delete(entries, "ExportPool(closed fd-backed imported)")
	}
	delete(entries, "ImportedPool.Allocate") // refuses open pools too: not a closed-state answer
	for name, call := range entries {
		err := call()
		if assert.ErrorIs(t, err, cuda.ErrClosed, name) {
			assert.NotEmpty(t, err.Error(), name)
		}
	}
	assert.Equal(t, calls, kf.driverCalls(), "no driver call on closed things")

	// The Buffers that outlived their pool still close, and the last one
	// destroys it.
	require.NoError(t, live.Close())
	require.NoError(t, liveKeyless.Close())
	_, _, destroyed := kf.counts()
	assert.Equal(t, 1, destroyed)
	var _ *buffer.Buffer = live
}
