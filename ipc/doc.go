// Package ipc shares GPU memory between processes on Linux, through POSIX
// file descriptors.
//
// The flow, as in cuda.core:
//
//  1. The owner creates an IPC-enabled pool (resource.NewDevicePool with
//     IPC set) and exports it: ExportPool returns a Handle (an fd, the
//     pool's UUID and the pool's secret key).
//  2. The Handle travels to another process: over a Unix socket
//     (SendHandle / ReceiveHandle: the fd by SCM_RIGHTS, UUID and key in
//     the message), or to a child process (Handle.ExtraFile with
//     exec.Cmd.ExtraFiles, plus Handle.Token written to a pipe the child
//     reads, its stdin say, which the child turns back into a Handle with
//     NewHandleFromToken). The token holds the pool key: never pass it in
//     the environment, which every grandchild inherits and
//     /proc/PID/environ shows. A Handle's fd is close-on-exec, so it
//     reaches only the children it is handed to.
//  3. The other process imports it: ImportPool maps the pool once per UUID
//     (a registry keyed by UUID dedupes repeated imports; see Lookup).
//  4. Buffers travel as Descriptors: plain, versioned, checksummed bytes
//     sealed with the pool key (ExportBuffer, Descriptor.MarshalBinary)
//     that the importer turns into Buffers of the imported pool
//     (ImportedPool.Import).
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
// (one shared core, internal/poolcore): its imports and exports (Import,
// ImportUnauthenticated, ImportForeign, Export, ExportFabric, and
// ExportBuffer of its Buffers) hold the pool open, so a concurrent Close
// waits for those in progress, and those that start after it fail at once
// with cuda.ErrClosed, whatever their arguments, as they do for a closed
// Handle or Buffer. A closed pool lives on until its last Buffer is
// closed, which destroys it; a destruction that fails is reported, and
// retried, by the next Close.
//
// # Threat model
//
// What arrives from another process is input, not trust, but the driver
// cannot be made to treat it so: it parses a descriptor's export data
// without validating it, and malformed export data can crash the
// importing process inside the driver (seen: SIGSEGV in
// cuMemPoolImportPointer, on export data with a few bits flipped). No check in the importer can tell good export data from bad,
// so this package decides by who made it:
//
//   - Each exported pool has a random 32-byte key, made on its first
//     export (crypto/rand) and sent with every Handle of the pool, never
//     with descriptors. ExportBuffer seals each descriptor with an
//     HMAC-SHA256 (truncated to 16 bytes) of all its other fields under
//     the key; ImportedPool.Import recomputes it and refuses, before any
//     driver call, every descriptor the key does not authenticate:
//     corrupted ones, altered ones (size, pool, export data), and forged
//     ones from a process that has descriptors or the wire format but not
//     the key. Those refusals wrap ErrBadDescriptor, as does every other
//     refusal of a descriptor (another pool's UUID, size 0, a size past
//     the mapping).
//   - A process that holds the key (the exporter, and every process the
//     Handle or its Token went to, re-exporters included) is trusted as
//     the exporter is: what it seals reaches the driver. Its descriptors'
//     sizes are still bounded by the mapping the driver reports, but if it
//     seals malformed export data, the driver may crash the importer, and
//     nothing on the importing side can prevent that. Share a Handle (and
//     its Token, which holds the key) only with processes you would let
//     crash yours.
//   - A Handle made from a raw fd (NewHandle, e.g. for a pool exported by
//     something other than cudamem) has no key: its pool's Import refuses
//     every descriptor, and ImportUnauthenticated takes them unchecked,
//     trusting the sender with this process's life as above.
//   - Legacy handles (cuIpcGetMemHandle, below) carry no key either: a
//     checksum catches corruption and the size is bounded by the mapping,
//     but their 64 opaque bytes go to cuIpcOpenMemHandle as received, so
//     open them only from a trusted sender; the same driver trust applies.
//   - The pool key authenticates descriptors, not the pool fd: whoever can
//     send this process an fd can send any pool. A second Handle for an
//     imported UUID under another key is refused (ImportPool), so a peer
//     cannot swap the key descriptors are checked with.
//
// Beyond that, descriptors and legacy handles are versioned and
// checksummed (corruption is caught when decoding), and every imported
// Buffer is bounded by the mapping the driver reports at its pointer: a
// descriptor claiming more (up to sizes near 2^64) is refused, and a
// refusal never unmaps memory another Buffer of this process uses.
// Messages on Unix sockets are framed (SendFDs, ReceiveFDs), so stream,
// seqpacket and datagram sockets all keep message boundaries; a malformed
// message is refused and every descriptor that came with it closed. A peer
// cannot fill this process with descriptors: they are taken only with a
// frame's first bytes and up to the count it announces (MaxFDs; one for
// ReceiveHandle), anything more is refused at once, and a Handle's fd of
// a kind no pool export is (a pipe, socket, file) is refused on arrival
// and by ImportPool.
//
// Legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle), as CuPy and PyTorch
// use for memory from cuMemAlloc, is in legacy.go.
//
// # Beyond one node: fabric handles
//
// A pool made with resource.DevicePoolOptions.Fabric can also be exported
// as a FabricHandle (ExportPoolFabric): the driver's 64-byte fabric handle
// with the pool's UUID and key, encoded as plain bytes (MarshalBinary) for
// any channel, since no file descriptor is involved. On another node of the
// same multi-node NVLink domain (GB200 NVL72), ImportPoolFabric maps it
// with ImportPool's checks: one pool per UUID in the registry, the same
// UUID under another key refused, descriptors authenticated by the key
// (buffers travel as Descriptors exactly as for fd pools). The key in a
// FabricHandle's encoding is as secret as a Handle's Token. The driver
// refuses fabric handles it did not make; without the IMEX service every
// fabric step fails with an error matching cuda.ErrNotSupported that names
// IMEX. A fabric-only pool's buffers export as usual (the pool is exported
// once as a fabric handle first); ExportPool needs the POSIX fd type.
//
// # Other libraries and languages
//
// cuda.core, CuPy and C programs share pools as the driver does: the
// pool's fd, and per buffer 64 bytes of export data and a size. Their
// parts map onto this package's:
//
//   - To them: a Handle's fd (FD, ExtraFile, or SendFDs on a Unix socket)
//     and UUID (cuda.core's IPCAllocationHandle carries a uuid.UUID; it is
//     optional there), and per buffer Descriptor.ExportData and
//     Descriptor.Size: cuda.core imports them with
//     DeviceMemoryResource.from_allocation_handle(device, fd) and
//     Buffer.from_ipc_descriptor(mr, IPCBufferDescriptor._init(data, size)).
//     They ignore the MAC and the pool key, which only cudamem importers
//     check.
//   - From them: NewHandle(fd, uuid) when the exporter sends a UUID (so
//     the registry dedups), NewForeignHandle(fd) for a bare fd (the UUID
//     is derived from the fd's file where that identifies it, see
//     FDIdentity); then ImportPool, and per buffer
//     ImportedPool.ImportForeign(data, size) (or NewRawDescriptor and
//     ImportUnauthenticated). These are the explicit unauthenticated path
//     of the threat model above: a foreign exporter has no pool key, so
//     its export data reaches the driver unchecked. Import them only from
//     processes this one trusts as it trusts itself.
//   - PyTorch shares CUDA tensors through torch.multiprocessing with legacy
//     IPC: a cudaIpcMemHandle of the allocator's segment plus the storage's
//     offset and size (UntypedStorage._share_cuda_()). OpenTorch maps one as
//     a Buffer bounded by the driver's mapping; ExportTorch describes
//     cuMemAlloc memory the same way for a Python process, which opens it
//     with cuIpcOpenMemHandle and hands PyTorch the pointer (plus the
//     offset) through __cuda_array_interface__.
//
// Accessors follow the module's convention for closed objects: Pool (of an
// ImportedPool) returns the zero MemPool once closed, and PoolErr an error
// matching cuda.ErrClosed.
//
// File descriptors are owned explicitly (internal/osfd: closed once,
// duplicated close-on-exec, a counted safety net for lost ones): every
// function says who closes what, and tests count open fds. The zero Handle
// and the zero ImportedPool own nothing; their Close does nothing.
package ipc
