// Package poolexport is the state package ipc keeps on an exported pool
// (its UUID and key), held by the pool itself (resource.DevicePool and
// PinnedPool) rather than in a table of package ipc: the state lives and
// dies with the pool, a new pool that reuses a dead one's driver handle
// starts afresh, and ipc needs no list of pool types. It is internal so
// that the pools can carry it without it being part of cudamem's API.
package poolexport
