// Package ipc shares GPU memory between processes on Linux, through POSIX
// file descriptors.
//
// The flow, as in cuda.core:
//
//  1. The owner creates an IPC-enabled pool (resource.NewDevicePool with
//     IPC set) and exports it: ExportPool returns a Handle (an fd plus the
//     pool's UUID).
//  2. The Handle travels to another process: over a Unix socket
//     (SendHandle / ReceiveHandle, SCM_RIGHTS) or to a child process
//     (Handle.ExtraFile with exec.Cmd.ExtraFiles).
//  3. The other process imports it: ImportPool maps the pool once per UUID
//     (a registry keyed by UUID dedupes repeated imports; see Lookup).
//  4. Buffers travel as Descriptors: plain, versioned, checksummed bytes
//     (ExportBuffer, Descriptor.MarshalBinary) that the importer turns into
//     Buffers of the imported pool (ImportedPool.Import).
//
// ExportBuffer works on any IPC-enabled pool, exported before or not: the
// driver refuses to export a pointer of a pool that was never exported,
// so the pool is exported once (and that fd closed) before its first
// buffer. Exports hold the pool open, so a concurrent Close waits.
//
// Buffers of an imported pool are owned by the importer's Buffer values:
// Close unmaps them (cuMemFreeAsync); the owner's memory lives on until it
// is freed there. An imported pool cannot allocate. The driver maps an
// allocation once per process, so importing one descriptor twice yields
// two Buffers on one mapping; the pool counts them and the last Close
// unmaps.
//
// An ImportedPool has the lifecycle of resource.DevicePool and PinnedPool
// (one shared core, internal/poolcore): Import and Export hold the pool
// open, so a concurrent Close waits for those in progress, and those that
// start after it fail at once with cuda.ErrClosed. A closed pool lives on
// until its last Buffer is closed, which destroys it; a destruction that
// fails is reported, and retried, by the next Close.
//
// What arrives from another process is input, not trust. Descriptors and
// legacy handles are versioned and checksummed (corruption is caught when
// decoding), and every imported Buffer is bounded by the mapping the
// driver reports at its pointer: a descriptor claiming more (up to sizes
// near 2^64) is refused, and a refusal never unmaps memory another Buffer
// of this process uses. Messages on Unix sockets are framed (SendFDs,
// ReceiveFDs), so stream, seqpacket and datagram sockets all keep message
// boundaries; a malformed message is refused and every descriptor that
// came with it closed.
//
// Legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle), as CuPy and PyTorch
// use for memory from cuMemAlloc, is in legacy.go.
//
// File descriptors are owned explicitly (internal/osfd: closed once,
// duplicated close-on-exec, a counted safety net for lost ones): every
// function says who closes what, and tests count open fds. The zero Handle
// and the zero ImportedPool own nothing; their Close does nothing.
package ipc
