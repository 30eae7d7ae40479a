package ownedmem

import "github.com/cudamem/cudamem/cuda"

// Funcs are a resource package's entry points.
type Funcs struct {
	// Allocate allocates size bytes ordered on s from mr, unrecorded; ok
	// is false for a resource it does not handle.
	Allocate func(mr any, size uint64, s *cuda.Stream) (ptr cuda.DevicePtr, rs *cuda.Stream, ok bool, err error)
	// Free frees what Allocate handed out; ok is false for a resource it
	// does not handle.
	Free func(mr any, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) (ok bool, err error)
	// Adopt records an address Allocate handed out as one the resource's
	// Deallocate frees (a Buffer's memory after Disown).
	Adopt func(mr any, ptr cuda.DevicePtr, size uint64)
}

var funcs Funcs

// Register installs f. Call it from an init function, before any Buffer
// is made.
func Register(f Funcs) { funcs = f }

// Allocate calls the registered Allocate; ok is false if there is none or
// it does not handle mr.
func Allocate(mr any, size uint64, s *cuda.Stream) (ptr cuda.DevicePtr, rs *cuda.Stream, ok bool, err error) {
	if funcs.Allocate == nil {
		return 0, nil, false, nil
	}
	return funcs.Allocate(mr, size, s)
}

// Free calls the registered Free; ok is false if there is none or it does
// not handle mr.
func Free(mr any, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) (ok bool, err error) {
	if funcs.Free == nil {
		return false, nil
	}
	return funcs.Free(mr, ptr, size, s)
}

// Adopt calls the registered Adopt, if any.
func Adopt(mr any, ptr cuda.DevicePtr, size uint64) {
	if funcs.Adopt != nil {
		funcs.Adopt(mr, ptr, size)
	}
}
