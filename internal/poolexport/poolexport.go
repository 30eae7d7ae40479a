// Package poolexport is the state package ipc keeps on an exported pool
// (its UUID and key), held by the pool itself (resource.DevicePool and
// PinnedPool) rather than in a table of package ipc: the state lives and
// dies with the pool, a new pool that reuses a dead one's driver handle
// starts afresh, and ipc needs no list of pool types. It is internal so
// that the pools can carry it without it being part of cudamem's API.
package poolexport

import "sync"

// Slot holds one value, made on first use. The zero Slot is empty and
// ready to use; a Slot must not be copied after first use.
type Slot struct {
	once sync.Once
	v    any
}

// Get returns the slot's value, made by make on the first call; a nil
// Slot has none and returns nil.
func (s *Slot) Get(make func() any) any {
	if s == nil {
		return nil
	}
	s.once.Do(func() { s.v = make() })
	return s.v
}
