package cuda

import (
	"crypto/rand"
	"encoding/hex"
)

// UUID is a 16-byte identity: a CUuuid naming a device (Device.UUID), and
// the name of an exported memory pool across processes (package ipc uses
// this same type). String gives the canonical 8-4-4-4-12 form; GPUString
// the form nvidia-smi prints for devices.
type UUID [16]byte

// NewUUID returns a random (version 4) UUID.
func NewUUID() UUID {
	var u UUID
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails on supported systems
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// String formats u as 8-4-4-4-12 lowercase hex digits.
func (u UUID) String() string {
	var b [36]byte
	u.format(b[:])
	return string(b[:])
}

// GPUString formats u the way nvidia-smi prints GPU UUIDs:
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
func (u UUID) GPUString() string {
	var b [40]byte
	copy(b[:], "GPU-")
	u.format(b[4:])
	return string(b[:])
}

func (u UUID) format(b []byte) {
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
}

// ParseUUID parses the String form (hex digits in either case). Anything
// else is refused with an error matching ErrInvalidArgument.
func ParseUUID(s string) (UUID, error) {
	const op = "cuda.ParseUUID"
	var u UUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return UUID{}, Errorf(op, ErrInvalidArgument, "malformed UUID %q (want 8-4-4-4-12 hex digits)", s)
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return UUID{}, Errorf(op, ErrInvalidArgument, "malformed UUID %q: %v", s, err)
	}
	return u, nil
}
