package cuda

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// This file holds the driver's process checkpoint calls
// (cuCheckpointProcess*, CUDA 12.8 and later, Linux): lock another CUDA
// process's CUDA API, move its GPU memory to host memory and release its
// device resources, put them back, and unlock it. Package
// cuda/checkpoint is the API built on them; the calls here take the
// process by id and need no context.

// ProcessState is a CUDA process's checkpoint state (CUprocessState).
type ProcessState int32

// Checkpoint states, with the transitions the driver allows: Lock takes a
// running process to locked; Checkpoint a locked one to checkpointed;
// Restore a checkpointed one back to locked; Unlock a locked one to
// running.
const (
	ProcessRunning      ProcessState = 0 // CUDA calls run (the default)
	ProcessLocked       ProcessState = 1 // CUDA calls block until unlocked
	ProcessCheckpointed ProcessState = 2 // GPU memory is in host memory; device resources are released
	ProcessFailed       ProcessState = 3 // an uncorrectable error during checkpoint or restore
)

var processStateNames = [...]string{"running", "locked", "checkpointed", "failed"}

// String names the state as the driver's documentation does ("running",
// "locked", "checkpointed", "failed"), or ProcessState(n) for a value
// without a name.
func (s ProcessState) String() string {
	if s >= 0 && int(s) < len(processStateNames) {
		return processStateNames[s]
	}
	return "ProcessState(" + strconv.Itoa(int(s)) + ")"
}

// CheckpointGPUPair is one GPU remapping of a restore (CUcheckpointGpuPair):
// the GPU the process was checkpointed on (Old) and the one to restore it
// onto (New), by UUID (Device.UUID).
type CheckpointGPUPair struct {
	Old, New UUID
}

// checkpointLockArgs is CUcheckpointLockArgs: a timeout and reserved words
// that must be zero.
type checkpointLockArgs struct {
	TimeoutMs uint32
	_         uint32
	_         [7]uint64
}

// checkpointRestoreArgs is CUcheckpointRestoreArgs: the GPU pairs, their
// count, and reserved bytes that must be zero (52 bytes with the pointer,
// then one reserved 64-bit word).
type checkpointRestoreArgs struct {
	GPUPairs      unsafe.Pointer
	GPUPairsCount uint32
	_             [52 - unsafe.Sizeof(uintptr(0))]byte
	_             uint64
}

// checkpointPid refuses a pid no process has (0, negative, or past a C
// int) for op before the driver sees it.
func checkpointPid(op string, pid int) error {
	if pid <= 0 || pid > math.MaxInt32 {
		return Errorf(op, ErrInvalidArgument, "pid %d (want a process id, 1 to %d)", pid, math.MaxInt32)
	}
	return nil
}

// checkpointProc checks pid for entry point name, then loads the driver
// and returns the entry point pick chooses, which the caller calls (with
// its arguments' pointers converted in the call itself, as the loader
// requires). A driver without the entry point gives an error matching
// ErrNotSupported that names it, at the call.
func checkpointProc(name string, pick func(*driver) *loader.Proc, pid int) (*loader.Proc, error) {
	if err := checkpointPid(name, pid); err != nil {
		return nil, err
	}
	d, err := load()
	if err != nil {
		return nil, err
	}
	return pick(d), nil
}

// CheckpointProcessLock locks the CUDA process pid
// (cuCheckpointProcessLock): its CUDA calls block until
// CheckpointProcessUnlock. The process must be running. timeoutMs bounds
// the wait for the lock in milliseconds (0: no bound); when it passes, the
// call fails and the process stays running.
func CheckpointProcessLock(pid int, timeoutMs uint32) error {
	p, err := checkpointProc("cuCheckpointProcessLock", func(d *driver) *loader.Proc { return &d.CheckpointProcessLock }, pid)
	if err != nil {
		return err
	}
	args := checkpointLockArgs{TimeoutMs: timeoutMs}
	return result(p, p.Call(uintptr(pid), uintptr(unsafe.Pointer(&args))))
}

// CheckpointProcessCheckpoint checkpoints the locked CUDA process pid
// (cuCheckpointProcessCheckpoint): its GPU memory is copied to host memory
// and its device resources released. The process is then checkpointed.
func CheckpointProcessCheckpoint(pid int) error {
	p, err := checkpointProc("cuCheckpointProcessCheckpoint", func(d *driver) *loader.Proc { return &d.CheckpointProcessCheckpoint }, pid)
	if err != nil {
		return err
	}
	return result(p, p.Call(uintptr(pid), 0))
}

// CheckpointProcessRestore restores the checkpointed CUDA process pid
// (cuCheckpointProcessRestore), onto the GPUs it was checkpointed on, or,
// with pairs, onto each pair's New GPU in place of its Old one (pairs must
// then name every GPU the process was checkpointed on; a GPU restored onto
// must have the memory and be of the same chip). The process is then
// locked. Restoring needs persistence mode on, or cuInit called in the
// restoring process beforehand (this package's loading does that).
// Remapping needs a CUDA 13.0 driver: an older one refuses pairs with an
// error matching ErrNotSupported, before the call.
func CheckpointProcessRestore(pid int, pairs []CheckpointGPUPair) error {
	var version int
	p, err := checkpointProc("cuCheckpointProcessRestore", func(d *driver) *loader.Proc { version = d.Version; return &d.CheckpointProcessRestore }, pid)
	if err != nil {
		return err
	}
	if len(pairs) == 0 {
		return result(p, p.Call(uintptr(pid), 0))
	}
	if version < 13000 {
		return &OpError{Op: p.Name(), Err: fmt.Errorf("%w: GPU remapping on restore needs a CUDA 13.0 driver, this one is %s", ErrNotSupported, VersionString(version))}
	}
	if uint64(len(pairs)) > math.MaxUint32 {
		return Errorf(p.Name(), ErrInvalidArgument, "%d GPU pairs", len(pairs))
	}
	// The pairs are Go memory the driver reads during the call only.
	args := checkpointRestoreArgs{GPUPairs: unsafe.Pointer(&pairs[0]), GPUPairsCount: uint32(len(pairs))}
	r := p.Call(uintptr(pid), uintptr(unsafe.Pointer(&args)))
	runtime.KeepAlive(pairs)
	return result(p, r)
}

// CheckpointProcessUnlock unlocks the locked CUDA process pid
// (cuCheckpointProcessUnlock): its CUDA calls run again.
func CheckpointProcessUnlock(pid int) error {
	p, err := checkpointProc("cuCheckpointProcessUnlock", func(d *driver) *loader.Proc { return &d.CheckpointProcessUnlock }, pid)
	if err != nil {
		return err
	}
	return result(p, p.Call(uintptr(pid), 0))
}

// CheckpointProcessGetState returns the checkpoint state of the CUDA
// process pid (cuCheckpointProcessGetState).
func CheckpointProcessGetState(pid int) (ProcessState, error) {
	p, err := checkpointProc("cuCheckpointProcessGetState", func(d *driver) *loader.Proc { return &d.CheckpointProcessGetState }, pid)
	if err != nil {
		return 0, err
	}
	var s ProcessState
	if r := p.Call(uintptr(pid), uintptr(unsafe.Pointer(&s))); !ok(r) {
		return 0, fail(p, r)
	}
	return s, nil
}

// CheckpointProcessGetRestoreThreadID returns the id of the thread of the
// CUDA process pid that restores it (cuCheckpointProcessGetRestoreThreadId),
// for checkpointing tools that must tell it from the process's own
// threads.
func CheckpointProcessGetRestoreThreadID(pid int) (int, error) {
	p, err := checkpointProc("cuCheckpointProcessGetRestoreThreadId", func(d *driver) *loader.Proc { return &d.CheckpointProcessGetRestoreThreadId }, pid)
	if err != nil {
		return 0, err
	}
	var tid int32
	if r := p.Call(uintptr(pid), uintptr(unsafe.Pointer(&tid))); !ok(r) {
		return 0, fail(p, r)
	}
	return int(tid), nil
}
