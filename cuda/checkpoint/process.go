package checkpoint

import (
	"fmt"
	"math"
	"time"

	"github.com/cudamem/cudamem/cuda"
)

// State is a process's checkpoint state: cuda.ProcessRunning,
// cuda.ProcessLocked, cuda.ProcessCheckpointed or cuda.ProcessFailed.
type State = cuda.ProcessState

// Process is a CUDA process to checkpoint and restore, named by its
// process id. The zero Process (PID 0) names none: its methods return an
// error matching cuda.ErrInvalidArgument. A Process holds nothing; its
// methods are safe from any goroutine, and the driver decides what
// concurrent calls on one process do.
type Process struct {
	PID int
}

// Lock locks the process: its CUDA calls block until Unlock. It must be
// running. timeout bounds the wait for the driver to take the lock (0:
// no bound; a positive timeout rounds up to whole milliseconds); when it
// passes, Lock returns the driver's error and the process stays running.
// A negative timeout, or one past 2^32-1 milliseconds, is refused with
// cuda.ErrInvalidArgument.
func (p Process) Lock(timeout time.Duration) error {
	const op = "Process.Lock"
	if timeout < 0 || timeout > math.MaxUint32*time.Millisecond {
		return p.wrap(op, cuda.Errorf("cuCheckpointProcessLock", cuda.ErrInvalidArgument, "timeout %v (want 0 for none, or up to %v)", timeout, math.MaxUint32*time.Millisecond))
	}
	return p.wrap(op, cuda.CheckpointProcessLock(p.PID, lockMs(timeout)))
}

// lockMs is a Lock timeout in the driver's whole milliseconds, rounded
// up: a positive timeout of less than one would be 0, no timeout at all.
// timeout is between 0 and 2^32-1 milliseconds.
func lockMs(timeout time.Duration) uint32 {
	return uint32((timeout + time.Millisecond - 1) / time.Millisecond)
}

// Checkpoint checkpoints the locked process: its GPU memory is copied to
// host memory (in the process) and its device memory and handles are
// released. It is then checkpointed, and stays locked.
func (p Process) Checkpoint() error {
	return p.wrap("Process.Checkpoint", cuda.CheckpointProcessCheckpoint(p.PID))
}

// RestoreOptions are the options of Process.Restore.
type RestoreOptions struct {
	// GPUs maps each GPU the process was checkpointed on to the GPU to
	// restore it onto, by UUID (cuda.Device.UUID). Empty: every GPU is
	// restored onto itself. Otherwise it must name every GPU the driver
	// knows the process by (every GPU of the machine, whatever
	// CUDA_VISIBLE_DEVICES hides), a GPU may be the target of one GPU
	// only, and the target must be of the same chip and have the memory.
	// Remapping needs a CUDA 13.0 driver.
	GPUs map[cuda.UUID]cuda.UUID
}

// Restore restores the checkpointed process: its memory goes back to the
// GPUs it was on (or those opts.GPUs maps them to), at the same device
// addresses. It is then locked again: Unlock lets it run. opts may be nil.
func (p Process) Restore(opts *RestoreOptions) error {
	const op = "Process.Restore"
	var pairs []cuda.CheckpointGPUPair
	if opts != nil && len(opts.GPUs) > 0 {
		onto := make(map[cuda.UUID]cuda.UUID, len(opts.GPUs))
		for old, gpu := range opts.GPUs {
			switch {
			case old == cuda.UUID{} || gpu == cuda.UUID{}:
				return p.wrap(op, cuda.Errorf("RestoreOptions.GPUs", cuda.ErrInvalidArgument, "zero UUID in %v -> %v (want device UUIDs, from cuda.Device.UUID)", old.GPUString(), gpu.GPUString()))
			case onto[gpu] != cuda.UUID{}:
				return p.wrap(op, cuda.Errorf("RestoreOptions.GPUs", cuda.ErrInvalidArgument, "%v is the target of both %v and %v (one GPU restores onto each)", gpu.GPUString(), onto[gpu].GPUString(), old.GPUString()))
			}
			onto[gpu] = old
			pairs = append(pairs, cuda.CheckpointGPUPair{Old: old, New: gpu})
		}
	}
	return p.wrap(op, cuda.CheckpointProcessRestore(p.PID, pairs))
}

// Unlock unlocks the locked process: its CUDA calls run again.
func (p Process) Unlock() error {
	return p.wrap("Process.Unlock", cuda.CheckpointProcessUnlock(p.PID))
}

// State returns the process's checkpoint state.
func (p Process) State() (State, error) {
	s, err := cuda.CheckpointProcessGetState(p.PID)
	if err != nil {
		return 0, p.wrap("Process.State", err)
	}
	return s, nil
}

// RestoreThreadID returns the id of the process's thread that the driver
// restores it with, which a CPU-side checkpointing tool must tell from the
// process's own threads.
func (p Process) RestoreThreadID() (int, error) {
	tid, err := cuda.CheckpointProcessGetRestoreThreadID(p.PID)
	if err != nil {
		return 0, p.wrap("Process.RestoreThreadID", err)
	}
	return tid, nil
}

// String names the process: "process 1234".
func (p Process) String() string { return fmt.Sprintf("process %d", p.PID) }

// wrap names op and the pid in err (nil stays nil).
func (p Process) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return &cuda.OpError{Op: op, Err: fmt.Errorf("pid %d: %w", p.PID, err)}
}
