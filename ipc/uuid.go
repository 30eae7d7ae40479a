package ipc

import "github.com/cudamem/cudamem/cuda"

// UUID names an exported pool across processes, so that a pool imported
// twice maps once (see ImportPool and Lookup). It is cuda.UUID, the type
// that also names devices.
type UUID = cuda.UUID

// ParseUUID parses the String form (hex digits in either case), as
// cuda.ParseUUID does. Anything else is refused with an error matching
// cuda.ErrInvalidArgument.
func ParseUUID(s string) (UUID, error) {
	u, err := cuda.ParseUUID(s)
	if err != nil {
		return UUID{}, &cuda.OpError{Op: "ipc.ParseUUID", Err: err}
	}
	return u, nil
}
