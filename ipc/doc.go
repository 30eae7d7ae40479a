// Package ipc shares GPU memory between processes on Linux: a pool
// exported as a file descriptor, its buffers as small authenticated
// descriptors that the other process maps, with nothing copied. It speaks
// cuda.core's formats, so Go and Python processes share memory both ways,
// and PyTorch's and CuPy's legacy IPC handles. The package example shares
// a pool and one buffer with a child process.
//
// The flow, as in cuda.core:
//
//  1. The owner creates an IPC-enabled pool (resource.NewDevicePool with
//     IPC set) and exports it: [ExportPool] returns a [Handle] (an fd, the
//     pool's UUID and the pool's secret key).
//  2. The Handle travels to another process: over a Unix socket
//     ([SendHandle] / [ReceiveHandle]: the fd by SCM_RIGHTS, UUID and key
//     in the message), or to a child process ([Handle.ExtraFile] with
//     exec.Cmd.ExtraFiles, plus [Handle.Token] written to a pipe the child
//     reads, its stdin say, which the child turns back into a Handle with
//     [NewHandle]). The token holds the pool key: never pass it in
//     the environment, which every grandchild inherits and
//     /proc/PID/environ shows. A Handle's fd is close-on-exec, so it
//     reaches only the children it is handed to.
//  3. The other process imports it: [ImportPool] maps the pool once per
//     UUID (see [Lookup]).
//  4. Buffers travel as Descriptors: plain, versioned, checksummed bytes
//     sealed with the pool key ([ExportBuffer], [Descriptor.MarshalBinary])
//     that the importer turns into Buffers of the imported pool
//     ([ImportedPool.Import]).
//
// # Which call to use
//
// Between Go processes that both use this package:
//
//   - a pool: [ExportPool], then [SendHandle] / [ReceiveHandle] over a Unix
//     socket (or [Handle.ExtraFile] and [Handle.Token] to a child), then
//     [ImportPool]. [ExportPool] of an [ImportedPool] re-exports it.
//   - its buffers: [ExportBuffer], [Descriptor.MarshalBinary] on any
//     channel, [Descriptor.UnmarshalBinary] and [ImportedPool.Import].
//   - other messages with descriptors: [SendFDs] / [ReceiveFDs], framed so
//     that a message arrives whole on any socket type.
//   - across nodes: [ExportPoolFabric] / [ImportPoolFabric] instead of the
//     pool's fd.
//
// With Python (cuda.core, PyTorch), CuPy or C, which know neither the
// framing nor the pool key: [SendPlain] / [ReceivePlain] (the format of
// Python's socket.send_fds and socket.recv_fds), [NewHandle] or
// [NewForeignHandle] for a received pool fd, [ImportedPool.ImportUnauthenticated]
// for its buffers, and legacy handles for cudaMalloc memory ([ExportLegacy],
// [OpenLegacy]; torch's shares through [NewTorchShare] and [ReleaseTorch]).
// All of these trust the sender with this process's life (see the threat
// model).
//
// Every receive takes a context: context.Background() waits as long as
// the connection's read deadline allows (none by default).
//
// An imported Buffer's Close unmaps it; the owner's memory lives on until
// it is freed there. Every function says who closes which file descriptor.
//
// # Threat model
//
// What arrives from another process is input, not trust, but the driver
// cannot be made to treat it so: it parses a descriptor's export data
// without validating it, and malformed export data can crash the
// importing process inside the driver. No check in the importer can tell
// good export data from bad, so this package decides by who made it:
//
//   - Each exported pool has a random 32-byte key, made on its first
//     export (crypto/rand) and sent with every Handle of the pool, never
//     with descriptors. ExportBuffer seals each descriptor with an
//     HMAC-SHA256 (truncated to 16 bytes) of all its other fields under
//     the key; ImportedPool.Import recomputes it and refuses, before any
//     driver call, every descriptor the key does not authenticate:
//     corrupted ones, altered ones (size, pool, export data), and forged
//     ones from a process that has descriptors or the wire format but not
//     the key. Those refusals wrap [ErrBadDescriptor], as does every other
//     refusal of a descriptor (another pool's UUID, size 0, a size past
//     the mapping).
//   - A process that holds the key (the exporter, and every process the
//     Handle or its Token went to) is trusted as the exporter is: what it
//     seals reaches the driver, and malformed export data it seals may
//     crash the importer. Share a Handle (and its Token, which holds the
//     key) only with processes you would let crash yours.
//   - A Handle made from a raw fd ([NewHandle], [NewForeignHandle], e.g.
//     for a pool exported by cuda.core) has no key: its pool's Import
//     refuses every descriptor, and [ImportedPool.ImportUnauthenticated]
//     takes a buffer's raw parts unchecked, trusting the sender with this
//     process's life as above.
//   - Legacy handles ([LegacyHandle]) carry no key either: their 64 opaque
//     bytes go to the driver as received, so open them only from a trusted
//     sender.
//   - The pool key authenticates descriptors, not the pool fd: whoever can
//     send this process an fd can send any pool. A second Handle for an
//     imported UUID under another key is refused (ImportPool), so a peer
//     cannot swap the key descriptors are checked with.
//
// Beyond that, descriptors and legacy handles are versioned and
// checksummed, and every imported Buffer is bounded by the mapping the
// driver reports at its pointer; a refusal never unmaps memory another
// Buffer of this process uses. A malformed message is refused and every
// descriptor that came with it closed. A peer cannot fill this process
// with descriptors: they are taken only up to the count a message
// announces ([MaxFDs]; one for ReceiveHandle), and a Handle's fd of a kind
// no pool export is (a pipe, socket, file) is refused on arrival and by
// ImportPool.
//
// # Other libraries and languages
//
//   - cuda.core pools: the pool's fd and UUID, and per buffer 64 bytes of
//     export data and a size. Send a Handle's fd ([Handle.FD]) with
//     [SendPlain], with [Descriptor.ExportData] and [Descriptor.Size];
//     cuda.core imports them with DeviceMemoryResource.from_allocation_handle
//     and Buffer.from_ipc_descriptor. The other way, [ReceivePlain] takes
//     what socket.send_fds sent, [NewHandle] the fd and UUID, and
//     [ImportedPool.ImportUnauthenticated] each buffer's parts.
//   - PyTorch tensors (UntypedStorage._share_cuda_()): [NewTorchShare],
//     then [OpenLegacy], whose Buffer's Close releases the share to torch.
//   - CuPy and C programs share cudaMalloc allocations as legacy IPC
//     handles: [OpenLegacy] and [ExportLegacy].
//
// Foreign exporters have no pool key: everything they send comes in on
// the unauthenticated path of the threat model above.
//
// # Beyond one node: fabric handles
//
// A pool made with resource.DevicePoolOptions.Fabric can also be exported
// as a [FabricHandle] ([ExportPoolFabric]), plain bytes for any channel
// that [ImportPoolFabric] maps on another node of the same NVLink domain;
// buffers travel as Descriptors. Its encoding's key is as secret as a
// Token. Without the IMEX service every fabric step fails with an error
// matching cuda.ErrNotSupported that names IMEX.
//
// # Nil and zero values
//
// Accessors follow the module's convention for closed objects: Pool (of an
// ImportedPool) returns the zero MemPool once closed, and PoolErr an error
// matching cuda.ErrClosed. The zero Handle and the zero ImportedPool own
// nothing; their Close does nothing.
package ipc
