package cuda

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The checkpoint calls' argument structs, laid out by hand from the
// header's definitions (LP64: 8-byte pointers, 4-byte unsigned int,
// 8-byte cuuint64_t): each 64 bytes, the restore pairs 32.
func TestCheckpointABILayout(t *testing.T) {
	assert.Equal(t, uintptr(64), unsafe.Sizeof(checkpointLockArgs{}), "sizeof CUcheckpointLockArgs")
	assert.Equal(t, uintptr(0), unsafe.Offsetof(checkpointLockArgs{}.TimeoutMs), "offsetof timeoutMs")
	assert.Equal(t, uintptr(32), unsafe.Sizeof(CheckpointGPUPair{}), "sizeof CUcheckpointGpuPair")
	assert.Equal(t, uintptr(16), unsafe.Offsetof(CheckpointGPUPair{}.New), "offsetof newUuid")
	assert.Equal(t, uintptr(64), unsafe.Sizeof(checkpointRestoreArgs{}), "sizeof CUcheckpointRestoreArgs")
	assert.Equal(t, uintptr(0), unsafe.Offsetof(checkpointRestoreArgs{}.GPUPairs), "offsetof gpuPairs")
	assert.Equal(t, unsafe.Sizeof(uintptr(0)), unsafe.Offsetof(checkpointRestoreArgs{}.GPUPairsCount), "offsetof gpuPairsCount")
	assert.Equal(t, uintptr(4), unsafe.Sizeof(ProcessState(0)), "sizeof CUprocessState")
}

func TestProcessStateMatchesHeader(t *testing.T) {
	got := map[string]int64{}
	for _, c := range headerEnum(t, readHeader(t), "CUprocessState_enum") {
		got[c.name] = c.value
	}
	assert.Equal(t, map[string]int64{
		"CU_PROCESS_STATE_RUNNING": int64(ProcessRunning), "CU_PROCESS_STATE_LOCKED": int64(ProcessLocked),
		"CU_PROCESS_STATE_CHECKPOINTED": int64(ProcessCheckpointed), "CU_PROCESS_STATE_FAILED": int64(ProcessFailed),
	}, got)
}

func TestProcessStateString(t *testing.T) {
	for s, want := range map[ProcessState]string{
		ProcessRunning: "running", ProcessLocked: "locked", ProcessCheckpointed: "checkpointed",
		ProcessFailed: "failed", 4: "ProcessState(4)", -1: "ProcessState(-1)",
	} {
		assert.Equal(t, want, s.String())
	}
}

// A pid no process can have is refused before the driver is loaded, naming
// the entry point and the pid.
func TestCheckpointRefusesBadPid(t *testing.T) {
	for _, pid := range []int{0, -1, -1 << 20} {
		for name, call := range map[string]func(int) error{
			"cuCheckpointProcessLock":       func(pid int) error { return CheckpointProcessLock(pid, 0) },
			"cuCheckpointProcessCheckpoint": CheckpointProcessCheckpoint,
			"cuCheckpointProcessRestore":    func(pid int) error { return CheckpointProcessRestore(pid, nil) },
			"cuCheckpointProcessUnlock":     CheckpointProcessUnlock,
			"cuCheckpointProcessGetState":   func(pid int) error { _, err := CheckpointProcessGetState(pid); return err },
			"cuCheckpointProcessGetRestoreThreadId": func(pid int) error {
				_, err := CheckpointProcessGetRestoreThreadID(pid)
				return err
			},
		} {
			err := call(pid)
			require.ErrorIs(t, err, ErrInvalidArgument, "%s(%d)", name, pid)
			assert.Contains(t, err.Error(), name)
			assert.Contains(t, err.Error(), fmt.Sprintf("pid %d", pid))
		}
	}
}
