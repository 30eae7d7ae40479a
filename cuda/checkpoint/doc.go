// Package checkpoint checkpoints and restores the GPU state of a CUDA
// process through the driver's checkpoint calls (CUDA 12.8 and later,
// Linux), as cuda.core's checkpoint.Process does. A Process names another
// process by id; its methods move it through the driver's states:
//
//	running --Lock--> locked --Checkpoint--> checkpointed
//	   ^                 |  ^                     |
//	   +-----Unlock------+  +-------Restore-------+
//
// Lock blocks the process's CUDA calls (they wait, they do not fail);
// Checkpoint copies its GPU memory to host memory and releases its device
// memory and handles, so the GPU is free for others (or for a CPU-side
// checkpoint, with CRIU for one, of the whole process); Restore puts the
// memory back at the same device addresses, on the same GPUs or, with
// RestoreOptions.GPUs, on others of the same chip; Unlock lets its CUDA
// calls run. The process's pointers stay valid throughout: memory it holds
// through cudamem (buffers, pools, virtual memory) reads back as it was.
//
// A call out of order is refused by the driver (CUDA_ERROR_ILLEGAL_STATE,
// matching cuda.ErrorIllegalState). A driver without the calls, or a
// platform without them, gives an error matching cuda.ErrNotSupported that
// says what is missing; the driver's own refusals (not supported on this
// system, not permitted) come back as its Result, wrapped. Every error
// names the operation and the process id.
//
// Checkpointing another process needs the rights to act on it (the same
// user, or root), as a debugger does; the process being checkpointed needs
// nothing of this package.
package checkpoint
