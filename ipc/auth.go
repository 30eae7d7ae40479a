package ipc

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"

	"github.com/cudamem/cudamem/cuda"
)

// keySize is the length of a pool key in bytes.
const keySize = 32

// MACSize is the length of a descriptor's MAC: HMAC-SHA256 truncated to
// 128 bits, plenty against forgery by a peer that cannot query the key.
const MACSize = 16

// poolKey is a pool's secret key (see the package doc's threat model);
// the zero poolKey is "no key".
//
// The bytes are a string behind a pointer, and never change once made:
// fmt prints a pointer to a string as an address, so printing any value
// that holds a poolKey through reflection shows no key byte. The types
// that hold one also format themselves redacted (see redacted.go).
type poolKey struct {
	k *string // nil: no key; else keySize bytes
}

// has reports whether k is a key (not "no key").
func (k poolKey) has() bool { return k.k != nil }

// newPoolKey returns a fresh random key (crypto/rand.Read does not fail).
func newPoolKey() poolKey {
	var b [keySize]byte
	_, _ = rand.Read(b[:])
	return keyFrom(b[:])
}

// keyFrom returns the key whose bytes are b (keySize of them), copied.
func keyFrom(b []byte) poolKey {
	s := string(b[:keySize])
	return poolKey{k: &s}
}

// mac computes d's MAC under k: HMAC-SHA256 over d's encoding up to its
// MAC, so that every field the importer acts on is covered.
func (k poolKey) mac(d Descriptor) [MACSize]byte {
	h := hmac.New(sha256.New, []byte(*k.k))
	body := d.body()
	h.Write(body[:])
	var out [MACSize]byte
	copy(out[:], h.Sum(nil))
	return out
}

// verify reports whether d carries a valid MAC under k (in constant time:
// a peer must not learn the MAC byte by byte from timings).
func (k poolKey) verify(d Descriptor) bool {
	if !k.has() {
		return false
	}
	want := k.mac(d)
	return hmac.Equal(want[:], d.MAC[:])
}

// equal reports whether k and o are the same key, or both none (in
// constant time: ImportPool compares a peer's key with the one in use).
func (k poolKey) equal(o poolKey) bool {
	if k.has() != o.has() {
		return false
	}
	return !k.has() || subtle.ConstantTimeCompare([]byte(*k.k), []byte(*o.k)) == 1
}

// seal returns d with its MAC set under k (no MAC without a key).
func (k poolKey) seal(d Descriptor) Descriptor {
	if k.has() {
		d.MAC = k.mac(d)
	} else {
		d.MAC = [MACSize]byte{}
	}
	return d
}

// tokenKeySep separates a token's UUID from its key in hex.
const tokenKeySep = "."

// Token returns h's UUID and pool key as text (the UUID, then '.' and the
// key in hex), for a process that gets h's fd without SendHandle (a child
// started with ExtraFile): pass it to NewHandle there. The token holds the
// pool's secret key: hand it only to the process that receives the fd,
// over a pipe or socket. Never put it in the child's environment or
// arguments (inherited by its children, readable in /proc/PID/environ and
// /proc/PID/cmdline), nor in a log line. A Handle without a key gives its
// UUID alone; a nil or zero Handle gives "".
func (h *Handle) Token() string {
	if h == nil || h.f == nil {
		return ""
	}
	if !h.key.has() {
		return h.uuid.String()
	}
	return h.uuid.String() + tokenKeySep + hex.EncodeToString([]byte(*h.key.k))
}

// HasKey reports whether h carries its pool's key (Handles from
// ExportPool, and ReceiveHandle or NewHandle of such a Handle, do; those
// made from a UUID alone do not).
func (h *Handle) HasKey() bool { return h != nil && h.f != nil && h.key.has() }

// parseToken parses what Token returns.
func parseToken(op, s string) (UUID, poolKey, error) {
	us, ks, keyed := strings.Cut(s, tokenKeySep)
	u, err := cuda.ParseUUID(us)
	if err != nil {
		// Not ParseUUID's message: it quotes its input, which may hold a
		// key (a token with a wrong separator), and keys stay out of
		// error text.
		return UUID{}, poolKey{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "malformed token of %d bytes: want a UUID (8-4-4-4-12 hex digits), then '.' and a %d-hex-digit key", len(s), 2*keySize)
	}
	if !keyed {
		return u, poolKey{}, nil
	}
	if len(ks) != 2*keySize {
		return UUID{}, poolKey{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "malformed token: key of %d hex digits, want %d", len(ks), 2*keySize)
	}
	var kb [keySize]byte
	if _, err := hex.Decode(kb[:], []byte(ks)); err != nil {
		// The key is secret: name the failure, not the digits.
		return UUID{}, poolKey{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "malformed token: the key is not hex")
	}
	return u, keyFrom(kb[:]), nil
}
