package ipc

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
)

// fixedKey is a pool key with known bytes, so that fuzz corpus entries can
// carry a valid MAC.
func fixedKey() poolKey {
	var b [keySize]byte
	for i := range b {
		b[i] = byte(0xc0 + i)
	}
	return keyFrom(b[:])
}

// reseal re-encodes d with a valid checksum over whatever it holds, as a
// peer that knows the format (but not the key) would: decoding accepts
// it, so only Import's MAC check stands between it and the driver.
func reseal(t testing.TB, d Descriptor) Descriptor {
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	var out Descriptor
	require.NoError(t, out.UnmarshalBinary(b))
	return out
}

// TestImportRefusesUnauthenticatedBeforeDriver is the CPU regression test
// for the GPU finding (driver 580 crashed in cuMemPoolImportPointer on
// mutated export data behind a valid checksum): a descriptor the pool's
// key does not authenticate is refused before any driver call, however it
// was altered; the genuine one still imports.
func TestImportRefusesUnauthenticatedBeforeDriver(t *testing.T) {
	p, f := fakePool(t)
	genuine := desc(p, 1, 1<<20, 1<<20)
	other := newPoolKey()
	mutate := map[string]func(d *Descriptor){
		"export data bit flipped": func(d *Descriptor) { d.Data.Reserved[17] ^= 0x04 },
		"export data random": func(d *Descriptor) {
			for i := range d.Data.Reserved {
				d.Data.Reserved[i] = byte(i*31 + 7)
			}
		},
		"size smaller":          func(d *Descriptor) { d.Size = 4096 },
		"size near 2^64":        func(d *Descriptor) { d.Size = math.MaxUint64 },
		"MAC bit flipped":       func(d *Descriptor) { d.MAC[0] ^= 1 },
		"MAC zero":              func(d *Descriptor) { d.MAC = [MACSize]byte{} },
		"sealed by another key": func(d *Descriptor) { *d = other.seal(*d) },
		"export data changed, sealed by another key": func(d *Descriptor) {
			d.Data.Reserved[3] ^= 0xff
			*d = other.seal(*d)
		},
	}
	for name, m := range mutate {
		t.Run(name, func(t *testing.T) {
			d := genuine
			m(&d)
			d = reseal(t, d) // through the wire: valid checksum
			calls := f.driverCalls()
			b, err := p.Import(d, nil)
			require.Error(t, err)
			assert.Nil(t, b)
			assert.ErrorIs(t, err, ErrBadDescriptor)
			assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Contains(t, err.Error(), "not authenticated by the key of pool "+p.UUID().String())
			assert.Equal(t, calls, f.driverCalls(), "refused before any driver call")
			assert.Zero(t, p.Live())
		})
	}
	b, err := p.Import(reseal(t, genuine), nil)
	require.NoError(t, err, "the genuine descriptor imports")
	assert.Equal(t, uint64(1<<20), b.Size())
	require.NoError(t, b.Close())
	require.NoError(t, p.Close())
}

// TestKeylessPoolNeedsExplicitOptIn: a pool imported from a Handle with no
// key (NewHandle, as for an exporter that is not cudamem) refuses every
// descriptor in Import without a driver call; ImportUnauthenticated takes
// them, still bounded by the mapping.
func TestKeylessPoolNeedsExplicitOptIn(t *testing.T) {
	f := newFake()
	p := newImportedPool(nil, cuda.MemPool{}, f, cuda.NewUUID(), poolKey{}, nil)
	d := Descriptor{Pool: p.UUID(), Size: 4096, Data: exportData(5, 4096)}
	for _, d := range []Descriptor{d, newPoolKey().seal(d)} {
		_, err := p.Import(d, nil)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "has no pool key")
		assert.Contains(t, err.Error(), "ImportUnauthenticated")
	}
	assert.Zero(t, f.driverCalls(), "refused before the driver")

	b, err := p.ImportUnauthenticated(d.ExportData(), d.Size, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), b.Size())
	// Re-exported unsealed: there is no key to seal with.
	re, err := ExportBuffer(b)
	require.NoError(t, err)
	assert.Equal(t, d, re)
	big := d
	big.Size = math.MaxUint64
	_, err = p.ImportUnauthenticated(big.ExportData(), big.Size, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument, "still bounded by the mapping")
	assert.Contains(t, err.Error(), "ImportedPool.ImportUnauthenticated")
	require.NoError(t, b.Close())
	_, err = p.ImportUnauthenticated(d.ExportData(), 0, nil)
	assert.ErrorIs(t, err, ErrBadDescriptor, "size 0")
	require.NoError(t, p.Close())
	_, err = p.ImportUnauthenticated(d.ExportData(), d.Size, nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	var zero *ImportedPool
	_, err = zero.ImportUnauthenticated(d.ExportData(), d.Size, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
}

// TestReexportKeepsKey: A's key goes with B's re-export (ExportPool of an ImportedPool
// and ExportBuffer of an imported Buffer), so C authenticates what B
// re-exports exactly as B did; a descriptor sealed by B under another key
// is refused by C.
func TestReexportKeepsKey(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no POSIX descriptors")
	}
	a := newPoolKey()
	u := cuda.NewUUID()
	fb := newFake()
	b := newImportedPool(nil, cuda.MemPool{}, fb, u, a, keptFile(t))
	fromA := a.seal(Descriptor{Pool: u, Size: 8192, Data: exportData(2, 8192)})
	buf, err := b.Import(fromA, nil)
	require.NoError(t, err)
	h, err := ExportPool(b)
	require.NoError(t, err)
	assert.True(t, h.HasKey())
	assert.True(t, h.key.equal(a), "B's Handle carries A's key")
	re, err := ExportBuffer(buf)
	require.NoError(t, err)
	assert.Equal(t, fromA, re, "re-exported as A sealed it")

	fc := newFake()
	c := newImportedPool(nil, cuda.MemPool{}, fc, h.UUID(), h.key, nil)
	got, err := c.Import(reseal(t, re), nil)
	require.NoError(t, err, "C authenticates B's re-export")
	require.NoError(t, got.Close())
	forged := newPoolKey().seal(re)
	_, err = c.Import(forged, nil)
	require.ErrorIs(t, err, ErrBadDescriptor)
	require.NoError(t, c.Close())
	require.NoError(t, buf.Close())
	require.NoError(t, h.Close())
	require.NoError(t, b.Close())
}

// TestImportPoolRefusesAnotherKey: a second Handle for an imported UUID
// under another key (or none) is another exporter claiming the name: it
// is refused, and cannot replace the key descriptors are checked with.
func TestImportPoolRefusesAnotherKey(t *testing.T) {
	p, _ := fakePool(t)
	register(p)
	defer p.Close()
	for name, k := range map[string]poolKey{"another key": newPoolKey(), "no key": {}} {
		registry.Lock()
		got, err := registered("ipc.ImportPool", nil, p.uuid, k)
		registry.Unlock()
		assert.Nil(t, got, name)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, name)
		assert.Contains(t, err.Error(), "another pool key", name)
	}
	registry.Lock()
	got, err := registered("ipc.ImportPool", nil, p.uuid, p.key)
	registry.Unlock()
	require.NoError(t, err)
	assert.Same(t, p, got, "the same key finds the pool")
}

// pipeReadEnd returns a fresh descriptor (a pipe's read end; the write
// end is closed) that the caller owns.
func pipeReadEnd(t *testing.T) int {
	t.Helper()
	f := keptFile(t)
	fd, err := f.Release()
	require.NoError(t, err)
	return fd
}

// TestTokenRoundTrip: Token and NewHandle carry a Handle's UUID
// and key to a child that got the fd through ExtraFiles; a malformed token
// is refused without taking the fd.
func TestTokenRoundTrip(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("checks descriptors through /proc")
	}
	fd := pipeReadEnd(t)
	u, k := cuda.NewUUID(), newPoolKey()
	h, err := NewHandle(fd, u.String())
	require.NoError(t, err)
	assert.False(t, h.HasKey())
	assert.Equal(t, u.String(), h.Token(), "a keyless Handle's token is its UUID")
	h.key = k
	tok := h.Token()
	assert.True(t, strings.HasPrefix(tok, u.String()+"."))
	assert.Len(t, tok, 36+1+2*keySize)

	fd2 := pipeReadEnd(t)
	h2, err := NewHandle(fd2, tok)
	require.NoError(t, err)
	assert.Equal(t, u, h2.UUID())
	assert.True(t, h2.HasKey())
	assert.True(t, h2.key.equal(k))
	assert.Equal(t, tok, h2.Token())
	got, err := h2.FD()
	require.NoError(t, err)
	assert.Equal(t, fd2, got, "ownership of the given fd")
	require.NoError(t, h2.Close())

	fd3 := pipeReadEnd(t)
	h3, err := NewHandle(fd3, u.String())
	require.NoError(t, err)
	assert.False(t, h3.HasKey(), "a UUID-only token makes a keyless Handle")
	require.NoError(t, h3.Close())

	bad := []string{
		"", "x", u.String() + ".", u.String() + "." + strings.Repeat("0", 2*keySize-1),
		u.String() + "." + strings.Repeat("g", 2*keySize), u.String() + "." + strings.Repeat("0", 2*keySize) + "00",
		strings.ToUpper(tok[:35]) + "." + tok[37:], tok[:36] + ":" + tok[37:],
	}
	fd4 := pipeReadEnd(t)
	for _, s := range bad {
		h, err := NewHandle(fd4, s)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "token %q", s)
		assert.Nil(t, h)
		assert.NotContains(t, err.Error(), tok[37:], "the key is not echoed")
		assert.True(t, fdOpen(fd4), "a refused token takes nothing: the fd is still the caller's")
	}
	require.NoError(t, osfd.Close(fd4))
	_, err = NewHandle(-1, tok)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	var nilH *Handle
	assert.Empty(t, nilH.Token())
	assert.Empty(t, (&Handle{}).Token())
	assert.False(t, nilH.HasKey())
	require.NoError(t, h.Close())
}

// TestDescriptorMACCoversEveryField: changing any one byte of what a
// descriptor encodes (size, pool, export data) or of its MAC invalidates
// it.
func TestDescriptorMACCoversEveryField(t *testing.T) {
	k := newPoolKey()
	d := k.seal(sampleDescriptor())
	require.True(t, k.verify(d))
	enc, err := d.MarshalBinary()
	require.NoError(t, err)
	for i := 12; i < descriptorCRC; i++ { // size, UUID, export data, MAC
		b := bytes.Clone(enc)
		b[i] ^= 0x80
		binary.LittleEndian.PutUint32(b[descriptorCRC:], crc32.ChecksumIEEE(b[:descriptorCRC]))
		var m Descriptor
		require.NoError(t, m.UnmarshalBinary(b), "byte %d", i)
		assert.False(t, k.verify(m), "byte %d changed, MAC still valid", i)
	}
	assert.False(t, poolKey{}.verify(d), "no key authenticates nothing")
	assert.False(t, poolKey{}.verify(Descriptor{}), "not even the zero descriptor")
}

// FuzzImportAuthenticated: whatever bytes arrive (given a valid checksum,
// so decoding accepts them), the driver is called only for a descriptor
// the pool's key authenticates; the fuzzer cannot produce one other than
// the genuine descriptor from its corpus.
func FuzzImportAuthenticated(f *testing.F) {
	k := fixedKey()
	u := UUID{0: 0xaa, 15: 0x55}
	genuine := k.seal(Descriptor{Pool: u, Size: 1 << 20, Data: exportData(1, 1<<20)})
	enc, err := genuine.MarshalBinary()
	require.NoError(f, err)
	f.Add(enc[:descriptorCRC])
	f.Add(func() []byte { b := bytes.Clone(enc[:descriptorCRC]); b[40] ^= 1; return b }())
	f.Add(func() []byte { b := bytes.Clone(enc[:descriptorCRC]); b[19] = 0xff; return b }())
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) != descriptorCRC {
			return
		}
		b := append(bytes.Clone(body), 0, 0, 0, 0)
		binary.LittleEndian.PutUint32(b[descriptorCRC:], crc32.ChecksumIEEE(b[:descriptorCRC]))
		var d Descriptor
		if err := d.UnmarshalBinary(b); err != nil {
			require.ErrorIs(t, err, ErrBadDescriptor)
			return
		}
		fk := newFake()
		p := newImportedPool(nil, cuda.MemPool{}, fk, u, k, nil)
		buf, err := p.Import(d, nil)
		if fk.driverCalls() > 0 {
			require.Equal(t, genuine, d, "only the genuine descriptor reaches the driver")
		}
		if d == genuine {
			require.NoError(t, err, "the genuine descriptor imports")
		}
		if err != nil {
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
		} else {
			require.Equal(t, genuine, d)
			require.NoError(t, buf.Close())
		}
		require.NoError(t, p.Close())
	})
}
