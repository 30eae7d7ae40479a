package ipc

import "github.com/cudamem/cudamem/cuda"

// UUID names an exported pool across processes, so that a pool imported
// twice maps once (see ImportPool and Lookup). It is cuda.UUID, the type
// that also names devices.
type UUID = cuda.UUID
