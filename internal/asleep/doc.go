// Package asleep is the registry of address ranges whose physical memory
// is released for now while the addresses stay reserved (virtual memory
// put to sleep). The packages that touch memory (buffer for every Buffer
// call, cuda for kernel launches) look ranges up here and refuse a use
// that overlaps one, with the error the sleeper registered, instead of
// letting the GPU fault on unmapped memory.
//
// Looking up costs one atomic load while nothing is asleep: the ranges are
// an immutable sorted slice, replaced whole under a lock by the rare
// writers.
package asleep
