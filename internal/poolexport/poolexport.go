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
