// Package resource provides memory resources: implementations of
// buffer.MemoryResource that hand out owned buffers of device, pinned host
// or managed memory, a fast Go-side sub-allocator, and adaptors that
// limit, count, track and log what goes through them. It brings
// cuda.core's memory resources to Go, with RMM's conveniences where
// cuda.core lacks them. The package example stacks a sub-allocator and
// statistics over the device's pool.
//
// # Choosing a resource
//
//   - [DevicePool]: device memory from a CUDA memory pool, stream ordered
//     (cuMemAllocFromPoolAsync). The fast, usual choice.
//     [CurrentDevicePool] borrows the device's current pool;
//     [NewDevicePool] creates and owns one ([DevicePoolOptions]).
//     cuda.core: DeviceMemoryResource. RMM: cuda_async_memory_resource.
//   - [PinnedPool]: page-locked host memory from a pool with a host (or
//     host NUMA) location, readable by the CPU and every device. cuda.core:
//     PinnedMemoryResource.
//   - [LegacyPinned]: page-locked host memory from cuMemHostAlloc, for
//     drivers without host pools. cuda.core: LegacyPinnedMemoryResource.
//   - [Managed]: managed (unified) memory from cuMemAllocManaged.
//   - [ManagedPool]: managed memory from a CUDA 13 managed pool, stream
//     ordered, with a preferred location. cuda.core:
//     ManagedMemoryResource with options. The buffers of both managed
//     resources take advice ([Advise], read back with [QueryManaged]),
//     prefetches ([Prefetch]) and discards ([Discard], [DiscardPrefetch]),
//     one at a time or many in one driver call ([PrefetchBatch],
//     [DiscardBatch], [DiscardPrefetchBatch]).
//   - [SyncDevice]: device memory from cuMemAlloc, for devices without
//     memory pools. cuda.core: _SynchronousMemoryResource.
//   - [Default] and [SetDefault]: a per-device default resource, chosen
//     automatically (DevicePool, else SyncDevice) until set.
//   - [SubAllocator]: a Go-side coalescing sub-allocator over any of the
//     above, for allocation-heavy code: same-stream pairs make no driver
//     call. RMM: pool_memory_resource.
//   - [GraphMemory]: graph memory, allocated only on a stream that is
//     capturing a graph (cuda.Stream.BeginCapture): the allocations and
//     frees become memory nodes of the graph, made at each launch.
//     Every other resource refuses a capturing stream with an error
//     matching cuda.ErrCapturing (the adaptors pass the stream to their
//     upstream, which decides), so the capture stays valid. cuda.core:
//     GraphMemoryResource.
//
// Adaptors wrap any resource and compose ([NewTracking] over
// [NewStatistics] over [NewLimiting] over a pool, say): [Limiting] caps the
// bytes in use, [Statistics] counts current, peak and total bytes and
// allocations, [Tracking] records live allocations with the stacks that
// made them, [Logging] writes a log/slog record (at Debug) for every
// allocation and free, and costs one Enabled check when the handler's
// level is above the records'. RMM: limiting, statistics, tracking and
// logging resource adaptors. Package resource/metrics serves Statistics
// and pool attributes to monitoring (expvar, Prometheus text);
// package resource/timeline records allocation events and draws them.
//
// A stack builds one Buffer per allocation, however deep: a
// [buffer.MemoryResource] hands out addresses (AllocatePtr); a layer over
// one takes the address, adds its books and passes it up, and only the
// top layer's Allocate wraps it in a Buffer that it owns
// ([buffer.Allocate]), so that Close goes down through every layer. A
// resource of your own implements the same five methods.
//
// # Streams
//
// Allocate and Deallocate take the stream that orders them; nil means the
// legacy default stream of the resource's device (device 0 for host
// memory). Stream-ordered memory (the pools) may be used on the
// allocation stream at once and on other streams after synchronizing with
// it; a Buffer frees on its allocation stream unless CloseOn names
// another. The synchronous resources (LegacyPinned, SyncDevice, Managed)
// wait for the stream before freeing, since their free calls are not
// stream ordered.
//
// # Lifetimes
//
// Buffers are closed by their users (Buffer.Close). Resources that own a
// driver object (an owned DevicePool, a PinnedPool) are closed with Close,
// which is idempotent; every later call on a closed resource, Attributes
// included, returns an error matching cuda.ErrClosed, except Deallocate, so
// buffers may outlive their resource. An owned pool is destroyed only when
// none of its buffers is live and its device's work has finished: by Close
// when nothing is allocated, else by the last buffer's Close (see
// [DevicePool.Close]). An owned DevicePool revokes its peer access before
// it is destroyed.
//
// Close waits for the calls in progress on the pool to return before it
// destroys anything; [DevicePool.Use] and [PinnedPool.Use] extend that to
// code outside the package (package ipc exports pools this way, and its
// imported pools follow the same lifecycle).
//
// Constructors either return a working resource or leave nothing behind:
// a pool created before a later step failed is destroyed, and an error
// from that clean-up is joined to the returned error.
//
// # Errors
//
// Errors name the operation ("DevicePool.Allocate: ...") and the values
// involved, and wrap the cause: match them with errors.Is against
// cuda.ErrClosed, cuda.ErrInvalidArgument (bad input, caught before the
// driver is called), cuda.ErrNotSupported (a device, driver or platform
// without the feature; tests skip on it) or a cuda.Result such as
// cuda.ErrorOutOfMemory. Nothing in this package panics on bad input: nil
// or zero-value devices, resources and streams, closed buffers and any
// size give errors. Sizes above 2^63 (or the address space of a 32-bit
// target) are refused before the driver sees them, since its rounding
// would wrap; a stream of another device given to a DevicePool or
// SyncDevice is refused; freeing through a pool with nothing live (memory
// it never handed out) is refused without calling the driver. Counters
// (Statistics, Tracking) saturate rather than wrap. Allocating size 0
// returns an empty buffer without calling the driver; deallocating
// address 0 does nothing.
//
// # Names
//
// Go names drop cuda.core's "MemoryResource" suffix, which the package
// name already says: resource.DevicePool is DeviceMemoryResource,
// DevicePool.SetPeerAccess and PeerAccess are peer_accessible_by, and
// PoolAttributes holds the attributes property as one 64-bit snapshot.
//
// # Waiting with a context
//
// Closing a pool or a sub-allocator, and trimming one, waits for the GPU.
// DevicePool.CloseContext, PinnedPool.CloseContext and
// SubAllocator.CloseContext and TrimContext first make that wait with a
// context.Context (cuda's SyncContext: no goroutine or thread per wait) and
// leave the resource as it was when the context ends first.
package resource
