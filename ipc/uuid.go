package ipc

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/cudamem/cudamem/cuda"
)

// UUID names an exported pool across processes, so that a pool imported
// twice maps once (see ImportPool and Lookup).
type UUID [16]byte

// NewUUID returns a random (version 4) UUID.
func NewUUID() UUID {
	var u UUID
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails on supported systems
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// String formats u as 8-4-4-4-12 hex digits.
func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// ParseUUID parses the String form (hex digits in either case). Anything
// else is refused with an error matching cuda.ErrInvalidArgument.
func ParseUUID(s string) (UUID, error) {
	var u UUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return UUID{}, cuda.Errorf("ipc.ParseUUID", cuda.ErrInvalidArgument, "malformed UUID %q (want 8-4-4-4-12 hex digits)", s)
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return UUID{}, cuda.Errorf("ipc.ParseUUID", cuda.ErrInvalidArgument, "malformed UUID %q: %v", s, err)
	}
	return u, nil
}
