package ipc

import (
	"fmt"
	"strconv"
)

// The types that hold a pool key implement fmt.Formatter: a key printed by
// accident (%v in a log line, %#v, %x) would let whoever reads it forge
// descriptors, so every verb prints the same redacted description (%#v a
// Go-syntax form of it, %q it quoted). Token and FabricHandle's
// MarshalBinary are the ways to get the key out, on purpose.

// keyRedacted stands for a key in formatted output.
const keyRedacted = "<redacted>"

// formatRedacted writes s (gos for %#v) for any verb.
func formatRedacted(f fmt.State, verb rune, s, gos string) {
	switch {
	case f == nil: // a direct call with no state to write to
	case verb == 'v' && f.Flag('#'):
		_, _ = fmt.Fprint(f, gos)
	case verb == 'q':
		_, _ = fmt.Fprint(f, strconv.Quote(s))
	default:
		_, _ = fmt.Fprint(f, s)
	}
}

// String says whether k is a key, not what it is.
func (k poolKey) String() string {
	if !k.has() {
		return "none"
	}
	return keyRedacted
}

// Format implements fmt.Formatter: no verb prints the key's bytes.
func (k poolKey) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, k.String(), "ipc.poolKey("+k.String()+")")
}

// String describes h (its pool's UUID, its fd, whether it has a key)
// without the key.
func (h *Handle) String() string {
	if h == nil || h.f == nil {
		return "ipc.Handle(zero)"
	}
	return fmt.Sprintf("ipc.Handle(pool %v, %v, key %v)", h.uuid, h.f, h.key)
}

// goString is String in Go syntax (for %#v), without the key.
func (h *Handle) goString() string {
	if h == nil || h.f == nil {
		return "&ipc.Handle{}"
	}
	return fmt.Sprintf("&ipc.Handle{uuid: %q, f: %q, key: %q}", h.uuid.String(), h.f.String(), h.key.String())
}

// Format implements fmt.Formatter, so that no verb prints h's key
// (values and pointers alike).
func (h Handle) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, h.String(), h.goString())
}

// goString is String in Go syntax (for %#v), without the key or the driver's bytes.
func (h *FabricHandle) goString() string {
	if h.zero() {
		return "&ipc.FabricHandle{}"
	}
	return fmt.Sprintf("&ipc.FabricHandle{uuid: %q, h: %q, key: %q}", h.uuid.String(), h.h.get().String(), h.key.String())
}

// Format implements fmt.Formatter, so that no verb prints h's key or
// the driver's fabric handle bytes (values and pointers alike).
func (h FabricHandle) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, h.String(), h.goString())
}

// goString is String in Go syntax (for %#v), without the key.
func (p *ImportedPool) goString() string {
	if p.zero() {
		return "&ipc.ImportedPool{}"
	}
	return fmt.Sprintf("&ipc.ImportedPool{uuid: %q, dev: %q, key: %q}", p.uuid.String(), fmt.Sprint(p.dev), p.key.String())
}

// Format implements fmt.Formatter, so that no verb prints the pool's key.
func (p *ImportedPool) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, p.String(), p.goString())
}
