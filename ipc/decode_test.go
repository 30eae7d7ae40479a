package ipc

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

func sampleLegacy() LegacyHandle {
	h := LegacyHandle{Offset: 4096, Size: 1 << 20}
	for i := range h.Handle.Reserved {
		h.Handle.Reserved[i] = byte(i*13 + 1)
	}
	return h
}

func TestLegacyRoundTrip(t *testing.T) {
	h := sampleLegacy()
	b, err := h.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, LegacyHandleSize)
	var got LegacyHandle
	require.NoError(t, got.UnmarshalBinary(b))
	assert.Equal(t, h, got, "the offset included")

	// A torch share's counter and event are torch's: not encoded, and
	// not silently dropped either.
	for _, share := range []LegacyHandle{{Size: 1, RefCounter: "/torch_1_2"}, {Size: 1, EventSync: true}} {
		_, err := share.MarshalBinary()
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	}
}

// TestLegacyRejectsGarbage: the legacy format is versioned and
// checksummed; a flipped size bit (which the unchecked format accepted as
// a larger size) is refused.
func TestLegacyRejectsGarbage(t *testing.T) {
	good, _ := sampleLegacy().MarshalBinary()
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		return b
	}
	reseal := func(b []byte) []byte {
		end := len(b) - 4
		binary.LittleEndian.PutUint32(b[end:], crc32.ChecksumIEEE(b[:end]))
		return b
	}
	for name, b := range map[string][]byte{
		"empty":              nil,
		"short":              good[:40],
		"long":               append(bytes.Clone(good), 0),
		"magic":              flip(0),
		"version":            flip(8),
		"size bit":           flip(14),
		"handle byte":        flip(40),
		"checksum":           flip(LegacyHandleSize - 1),
		"version 3 resealed": reseal(func() []byte { b := bytes.Clone(good); b[8] = 3; return b }()),
		"version 1 resealed": reseal(func() []byte { b := bytes.Clone(good); b[8] = 1; return b }()),
		"reserved resealed":  reseal(flip(10)),
		"unversioned 80-byte form": func() []byte {
			b := make([]byte, 80)
			copy(b, legacyMagic[:])
			binary.LittleEndian.PutUint64(b[8:], 1<<40)
			return b
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			h := sampleLegacy()
			orig := h
			err := h.UnmarshalBinary(b)
			require.ErrorIs(t, err, ErrBadDescriptor)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Equal(t, orig, h, "unchanged on error")
		})
	}
}

func TestDescriptorReservedBytes(t *testing.T) {
	good, _ := sampleDescriptor().MarshalBinary()
	b := bytes.Clone(good)
	b[11] = 1
	binary.LittleEndian.PutUint32(b[descriptorCRC:], crc32.ChecksumIEEE(b[:descriptorCRC]))
	var d Descriptor
	assert.ErrorIs(t, d.UnmarshalBinary(b), ErrBadDescriptor, "an accepted descriptor means one thing")
}

// TestDescriptorVersion1Refused: a version 1 descriptor (104 bytes, no
// MAC) is refused, by length and, resealed at the new length, by version:
// no importer could authenticate it.
func TestDescriptorVersion1Refused(t *testing.T) {
	v1 := make([]byte, 104)
	copy(v1, descriptorMagic[:])
	binary.LittleEndian.PutUint16(v1[8:], 1)
	binary.LittleEndian.PutUint64(v1[12:], 1<<20)
	binary.LittleEndian.PutUint32(v1[100:], crc32.ChecksumIEEE(v1[:100]))
	var d Descriptor
	err := d.UnmarshalBinary(v1)
	require.ErrorIs(t, err, ErrBadDescriptor)
	assert.Contains(t, err.Error(), "104 bytes")

	good, _ := sampleDescriptor().MarshalBinary()
	b := bytes.Clone(good)
	binary.LittleEndian.PutUint16(b[8:], 1)
	binary.LittleEndian.PutUint32(b[descriptorCRC:], crc32.ChecksumIEEE(b[:descriptorCRC]))
	err = d.UnmarshalBinary(b)
	require.ErrorIs(t, err, ErrBadDescriptor)
	assert.Contains(t, err.Error(), "version 1")
	assert.Equal(t, Descriptor{}, d, "unchanged")
}

func FuzzLegacyHandle(f *testing.F) {
	good, _ := sampleLegacy().MarshalBinary()
	f.Add(good)
	f.Add([]byte("cudamemL"))
	f.Add(make([]byte, LegacyHandleSize))
	f.Add(make([]byte, 80))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h LegacyHandle
		if err := h.UnmarshalBinary(b); err != nil {
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Equal(t, LegacyHandle{}, h, "unchanged on error")
			return
		}
		again, err := h.MarshalBinary()
		require.NoError(t, err)
		assert.Equal(t, b, again, "anything accepted re-encodes to the same bytes")
	})
}

// FuzzDescriptorResealed fuzzes the fields behind a valid checksum: the
// fuzzer's bytes (everything up to the checksum: body and MAC) are sealed
// with a correct CRC, so decoding reaches the version, reserved and size
// checks; whatever is accepted re-encodes identically (a size near 2^64
// decodes: bounding it is Import's job, tested in
// TestImportRefusesSizeOverflow; so does a MAC that does not verify:
// FuzzImportAuthenticated covers that).
func FuzzDescriptorResealed(f *testing.F) {
	good, _ := sampleDescriptor().MarshalBinary()
	f.Add(good[:descriptorCRC])
	f.Add(make([]byte, descriptorCRC))
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
		assert.Equal(t, descriptorMagic[:], b[:8])
		again, err := d.MarshalBinary()
		require.NoError(t, err)
		assert.Equal(t, b, again)
	})
}

func FuzzParseUUID(f *testing.F) {
	f.Add(cuda.NewUUID().String())
	f.Add("00000000-0000-0000-0000-000000000000")
	f.Add("ABCDEF01-2345-6789-abcd-ef0123456789")
	f.Add("zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := cuda.ParseUUID(s)
		if err != nil {
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			assert.Equal(t, UUID{}, u)
			return
		}
		assert.Equal(t, strings.ToLower(s), u.String(), "the canonical form of what was parsed")
		again, err := cuda.ParseUUID(u.String())
		require.NoError(t, err)
		assert.Equal(t, u, again)
	})
}
