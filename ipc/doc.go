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
// Buffers of an imported pool are owned by the importer's Buffer values:
// Close unmaps them (cuMemFreeAsync); the owner's memory lives on until it
// is freed there. An imported pool cannot allocate.
//
// Legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle), as CuPy and PyTorch
// use for memory from cuMemAlloc, is in legacy.go.
//
// File descriptors are owned explicitly: every function says who closes
// what, and tests count open fds.
package ipc
