// Package poolcore is the lifecycle shared by the handles of driver memory
// pools (resource.DevicePool, resource.PinnedPool, ipc.ImportedPool): who
// may use the pool now, how many allocations from it are live, and when an
// owned pool is destroyed.
//
// The rules it keeps:
//
//   - A call on the pool brackets its driver calls with Enter and Leave,
//     the methods of the cuda.Guard that Core embeds: Enter fails once
//     Close has begun, never blocks, and may nest (a call made from inside
//     Use's callback just fails once Close has begun); Close waits for the
//     calls in progress before it destroys anything.
//   - An owned pool is destroyed only when it is closed and no allocation
//     from it is live: by Close when nothing is live, else by the Freed
//     call of the last live allocation. Freeing into a destroyed pool, or
//     destroying one with allocations outstanding, was followed by
//     segmentation faults in the driver, so neither happens.
//   - A failed destruction leaves the pool closed but not destroyed; the
//     error of a deferred destruction (one run by Freed) is kept, and the
//     next Close retries and reports it.
//
// The zero Core is ready to use and owns nothing (Close destroys nothing);
// SetDestroy makes it own its pool. A Core must not be copied after first
// use.
//
// How a pool handle uses it (see resource.DevicePool):
//
//	if !c.Enter() { return ErrClosed }
//	ptr, err := alloc()
//	if err == nil { c.Allocated() }
//	c.Leave()
//
//	// Deallocate, which works after Close as well:
//	if !c.HasLive() { return error: not an allocation of this pool }
//	if err := free(ptr); err != nil { return err }
//	c.Freed() // may destroy the pool; its error is kept for Close
package poolcore
