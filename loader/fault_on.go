//go:build cudamemfault

package loader

import "github.com/cudamem/cudamem/internal/faultinject"

// With the cudamemfault tag every call of a resolved Proc passes through
// internal/faultinject first, which the fault sweeps drive.
const faultEnabled = true

//go:nosplit
//go:norace
func faultHit(fn uintptr) (uintptr, bool) { return faultinject.Hit(fn) }

func faultNote(addr uintptr, name string) { faultinject.Note(addr, name) }
