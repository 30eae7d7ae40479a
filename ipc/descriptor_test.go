package ipc

import (
	"bytes"
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUUID(t *testing.T) {
	a, b := cuda.NewUUID(), cuda.NewUUID()
	assert.NotEqual(t, a, b)
	assert.Equal(t, byte(0x40), a[6]&0xf0, "version 4")
	p, err := cuda.ParseUUID(a.String())
	require.NoError(t, err)
	assert.Equal(t, a, p)
	_, err = cuda.ParseUUID("not-a-uuid")
	assert.Error(t, err)
	_, err = cuda.ParseUUID("zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz")
	assert.Error(t, err)
}

func sampleDescriptor() Descriptor {
	d := Descriptor{Pool: cuda.NewUUID(), Size: 123456789}
	for i := range d.Data.Reserved {
		d.Data.Reserved[i] = byte(i * 7)
	}
	for i := range d.MAC {
		d.MAC[i] = byte(0xf0 - i)
	}
	return d
}

func TestDescriptorRoundTrip(t *testing.T) {
	d := sampleDescriptor()
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, DescriptorSize)
	var got Descriptor
	require.NoError(t, got.UnmarshalBinary(b))
	assert.Equal(t, d, got)
}

func TestDescriptorRejectsGarbage(t *testing.T) {
	good, _ := sampleDescriptor().MarshalBinary()
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x01
		return b
	}
	for name, b := range map[string][]byte{
		"empty":        nil,
		"short":        good[:50],
		"long":         append(bytes.Clone(good), 0),
		"magic":        flip(0),
		"version":      flip(8),
		"size bit":     flip(13),
		"export data":  flip(60),
		"MAC":          flip(descriptorBody + 3),
		"checksum":     flip(descriptorCRC + 1),
		"all zero":     make([]byte, DescriptorSize),
		"random bytes": bytes.Repeat([]byte{0xa5}, DescriptorSize),
	} {
		t.Run(name, func(t *testing.T) {
			var d Descriptor
			orig := d
			err := d.UnmarshalBinary(b)
			require.ErrorIs(t, err, ErrBadDescriptor)
			assert.Equal(t, orig, d, "unchanged on error")
		})
	}
}

func FuzzDescriptor(f *testing.F) {
	good, _ := sampleDescriptor().MarshalBinary()
	f.Add(good)
	f.Add([]byte("cudamemD"))
	f.Add(make([]byte, DescriptorSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Descriptor
		if err := d.UnmarshalBinary(b); err != nil {
			return
		}
		// Anything accepted must re-encode to the same bytes.
		again, err := d.MarshalBinary()
		require.NoError(t, err)
		assert.Equal(t, b, again)
	})
}
